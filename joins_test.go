package keyfold_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/services/servicetest"
)

// TestJoinsConfig: the example parses; a join's problems are reported all
// at once, each with its line.
func TestJoinsConfig(t *testing.T) {
	b, err := os.ReadFile("examples/joins.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := keyfold.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if j := cfg.Joins["paid_orders"]; j.Type != "interval" || j.Left.Pipeline != "orders" || *j.Upper != time.Hour || j.AllowedLateness != time.Minute {
		t.Errorf("paid_orders parsed as %+v", j)
	}
	if j := cfg.Joins["order_sessions"]; j.Type != "window" || j.Window != "session" || j.Gap != 10*time.Minute {
		t.Errorf("order_sessions parsed as %+v", j)
	}
	if j := cfg.Joins["paid_per_hour"]; j.Window != "sliding" || j.Size != time.Hour || j.Slide != 15*time.Minute {
		t.Errorf("paid_per_hour parsed as %+v", j)
	}
	_, err = keyfold.ParseConfig([]byte(`
pipelines:
  orders: {key: k, time: ts, id: id}
  payments: {key: k, time: ts, id: id}
joins:
  no_bound:
    type: interval
    left: {pipeline: orders}
    right: {pipeline: payments}
  typo:
    type: interval
    lowr: 1s
    left: {pipeline: orders, feilds: [a]}
    right: {pipeline: payments}
  orders:
    type: temporal
    left: {pipeline: payments}
    right: {pipeline: nowhere}
  slid:
    type: window
    window: sliding
    size: 10s
    slide: 3s
    left: {pipeline: orders}
    right: {pipeline: payments}
  sess:
    type: window
    window: session
    size: 1m
    left: {pipeline: orders}
    right: {pipeline: payments}
`))
	if err == nil {
		t.Fatal("ParseConfig accepted broken joins")
	}
	for _, want := range []string{
		`join "no_bound" (line 6): an interval join needs lower and upper`,
		`join "typo" (line 12): unknown key "lowr"`,
		`join "typo": left (line 13): unknown key "feilds" (known: fields, pipeline)`,
		`join "orders" (line 15): a pipeline has the same name`,
		`join "orders": right (line 18): pipeline "nowhere" is not defined`,
		`join "slid": slide (line 23): size 10s must be a multiple of slide 3s`,
		`join "sess": gap (line 26): session gap is required and must be positive: a window join without it has no time bound`,
		`join "sess": size (line 29): session windows take no size`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("errors lack %q:\n%v", want, err)
		}
	}
}

// TestJoinsHTTP: events posted to each side reach the join; the join's key
// shows its buffers; its results are outputs; a join takes no events of its
// own; its metrics are scraped.
func TestJoinsHTTP(t *testing.T) {
	b, err := os.ReadFile("examples/joins.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := servicetest.Config(t, string(b))
	cfg.HTTPAddr = "127.0.0.1:0"
	n := servicetest.Run(t, cfg)
	base := "http://" + n.HTTPAddr()
	post := func(pipeline, body string) (int, string) {
		resp, err := http.Post(base+"/v1/pipelines/"+pipeline+"/events", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("orders", `[{"order_id": "o1", "event_id": "e1", "ts": "2026-12-01T10:00:00Z", "amount": 30, "customer": "ann"}]`); code != 200 {
		t.Fatalf("POST orders: %d %s", code, body)
	}
	if code, body := post("payments", `[{"order_id": "o1", "event_id": "e2", "ts": "2026-12-01T10:20:00Z", "amount": 30, "method": "card"}]`); code != 200 {
		t.Fatalf("POST payments: %d %s", code, body)
	}
	if code, body := post("paid_orders", `[{"order_id": "o1", "event_id": "e3", "ts": "2026-12-01T10:20:00Z"}]`); code != 400 || !strings.Contains(body, "a join takes no events of its own") {
		t.Errorf("POST into the join: %d %s, want 400 saying why", code, body)
	}
	var ks keyfold.KeyState
	if code := getJSON(t, base+"/v1/pipelines/paid_orders/keys/o1", &ks); code != 200 || ks.Join == nil {
		t.Fatalf("GET the join's key: %d %+v", code, ks)
	}
	if j := ks.Join; j.Results != 1 || len(j.Sides) != 2 || j.Sides[0].Pipeline != "orders" || j.Sides[0].Buffered != 1 || j.Sides[1].Buffered != 1 ||
		!j.Sides[1].Oldest.Equal(time.Date(2026, 12, 1, 10, 20, 0, 0, time.UTC)) {
		t.Errorf("the join's key: %+v", j)
	}
	outs := waitForOutputsOf(t, base, "paid_orders", 1)
	o := outs[0]
	var v struct {
		Left, Right struct {
			ID     string
			Time   time.Time
			Fields map[string]any
		}
	}
	if err := json.Unmarshal(o.Values, &v); err != nil {
		t.Fatal(err)
	}
	if o.ID != fmt.Sprintf("paid_orders/o1/e1@%d/e2@%d", time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli(), time.Date(2026, 12, 1, 10, 20, 0, 0, time.UTC).UnixMilli()) || o.Kind != "interval" || v.Left.ID != "e1" || v.Right.ID != "e2" ||
		v.Left.Fields["customer"] != "ann" || v.Right.Fields["method"] != "card" || !v.Right.Time.Equal(time.Date(2026, 12, 1, 10, 20, 0, 0, time.UTC)) {
		t.Errorf("the join's result: %+v %s", o, o.Values)
	}
	// Followed as any pipeline's outputs are (SSE and gRPC Subscribe are
	// built on it).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errDone := errors.New("done")
	if err := n.Subscribe(ctx, "paid_orders", "", func(got keyfold.Output) error {
		if got.ID != o.ID {
			t.Errorf("Subscribe: %s, want %s", got.ID, o.ID)
		}
		return errDone
	}); !errors.Is(err, errDone) {
		t.Errorf("Subscribe: %v", err)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`keyfold_join_results_total{join="paid_orders"} 1`, `keyfold_join_buffered_events{join="paid_orders"} 2`,
		`keyfold_join_unmatched_total{join="paid_orders"} 0`, `keyfold_join_late_events_total{join="paid_orders"} 0`} {
		if !bytes.Contains(m, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// waitForOutputsOf reads pipeline's outputs until there are at least n.
func waitForOutputsOf(t *testing.T, base, pipeline string, n int) []keyfold.Output {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var page outputsPage
		if code := getJSON(t, fmt.Sprintf("%s/v1/pipelines/%s/outputs?limit=100", base, pipeline), &page); code != 200 {
			t.Fatalf("GET outputs: %d", code)
		}
		if len(page.Outputs) >= n {
			return page.Outputs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d outputs of %s, want %d", len(page.Outputs), pipeline, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJoinsRefusedOnAnOldStore: a node with joins on an embedded store
// created before the key-group layout was recorded does not start, and
// says why and what to do; without the joins it serves the same store.
func TestJoinsRefusedOnAnOldStore(t *testing.T) {
	b, err := os.ReadFile("examples/joins.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := servicetest.Config(t, string(b))
	old, err := embedded.Open(cfg.DataDir, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.CheckGroups(context.Background(), cfg.KeyGroups, 0); err != nil { // as an older build created it
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = n.Run(context.Background())
	if !errors.Is(err, actors.ErrLayout) || !strings.Contains(err.Error(), "Start the joins on a new store") {
		t.Fatalf("Run with joins on an old store: %v, want ErrLayout saying what to do", err)
	}
	cfg.Joins = nil
	servicetest.Run(t, cfg) // the pipelines alone: served as before
}
