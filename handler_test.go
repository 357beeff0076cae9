package keyfold_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/keyfold/keyfold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/servicetest"
)

// reminder sets a timer 3 s (event time) after each key's first event;
// when it fires it emits and records it in the state.
type reminder struct{}

type reminderState struct {
	Events int  `json:"events"`
	Fired  bool `json:"fired"`
}

func (reminder) OnEvent(k *keyfold.Key[reminderState], ev keyfold.Event) error {
	st := k.State()
	if st.Events == 0 {
		if err := k.SetTimer("remind", ev.Time.Add(3*time.Second)); err != nil {
			return err
		}
	}
	st.Events++
	k.Set(st)
	return nil
}

func (reminder) OnTimer(k *keyfold.Key[reminderState], t keyfold.Timer) error {
	st := k.State()
	st.Fired = true
	k.Set(st)
	return k.Emit("reminded", map[string]any{"timer": t.Name, "events": st.Events})
}

// runNode runs a node on cfg; stop closes it and checks Run's error.
func runNode(t *testing.T, cfg keyfold.Config) (*keyfold.Node, func()) {
	t.Helper()
	node, done := servicetest.Start(t, cfg)
	return node, func() {
		node.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// TestHandlerTimersFireAfterRestart: timers a Go handler set fire after the
// node restarted, for keys that get no other input and that were
// passivated out of memory, once the pipeline's watermark reaches them
// (moved by another key's event); each fires once, and the state its
// call set is what a query then shows. Event time only: the watermark
// never moves with the clock here (idle_timeout 1h).
func TestHandlerTimersFireAfterRestart(t *testing.T) {
	dir := t.TempDir()
	newCfg := func() keyfold.Config {
		cfg := keyfold.Config{
			DataDir: dir, CheckpointInterval: 50 * time.Millisecond, MaxActiveKeys: 2, MaxMemory: 1,
			Pipelines: map[string]keyfold.PipelineConfig{
				"r": {Key: "k", Time: "at", IdleTimeout: time.Hour},
			},
		}
		if err := keyfold.Handle(&cfg, "r", reminder{}); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	node, stop := runNode(t, newCfg())
	ctx := context.Background()
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	const keys = 20
	var batch []json.RawMessage
	for i := range keys {
		for range 2 {
			batch = append(batch, json.RawMessage(fmt.Sprintf(`{"k":"k%d","at":%d}`, i, start.UnixMilli())))
		}
	}
	if _, err := node.Ingest(ctx, "r", batch); err != nil {
		t.Fatal(err)
	}
	st, err := node.Query(ctx, "r", "k7")
	if err != nil || string(st.State) != `{"events":2,"fired":false}` {
		t.Fatalf("k7 before the restart: %s, %v", st.State, err)
	}
	outs, err := node.Outputs(ctx, "r", "", 100)
	if err != nil || len(outs) != 0 {
		t.Fatalf("before the restart: %d outputs (%v), want none", len(outs), err)
	}
	stop()

	node, stop = runNode(t, newCfg())
	defer stop()
	// Another key's event moves the watermark past every timer.
	if _, err := node.Ingest(ctx, "r", []json.RawMessage{json.RawMessage(fmt.Sprintf(`{"k":"other","at":%d}`, start.Add(10*time.Second).UnixMilli()))}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	eventually(t, "every timer fired after the restart", func() bool {
		outs, err := node.Outputs(ctx, "r", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			if prev, ok := got[o.Key]; ok && prev != o.ID {
				t.Fatalf("key %s reminded twice: %s and %s", o.Key, prev, o.ID)
			}
			if o.Kind != "handler" || o.Name != "reminded" || string(o.Values) != `{"events":2,"timer":"remind"}` {
				t.Fatalf("output %+v", o)
			}
			got[o.Key] = o.ID
		}
		return len(got) == keys
	})
	st, err = node.Query(ctx, "r", "k7")
	if err != nil || string(st.State) != `{"events":2,"fired":true}` || *st.HandlerFailures != 0 {
		t.Fatalf("k7 after its timer: %s, %v", st.State, err)
	}
}

// counter is a handler whose state is a version-1 count.
type counterV1 struct{ N int }

// counterV2 is its version 2: the count renamed, and a note.
type counterV2 struct {
	Count int    `json:"count"`
	Note  string `json:"note"`
}

// TestStateUpgrade: a state stored by version 1 of a handler is read by
// version 2 through its upgrade; a version 3 without one refuses to read
// it (the key is unavailable, not misread), and version 2 reads it again.
func TestStateUpgrade(t *testing.T) {
	dir := t.TempDir()
	cfgOf := func(register func(*keyfold.Config) error) keyfold.Config {
		cfg := keyfold.Config{DataDir: dir, Pipelines: map[string]keyfold.PipelineConfig{"c": {Key: "k"}}}
		if err := register(&cfg); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ctx := context.Background()
	v1 := func(cfg *keyfold.Config) error {
		return keyfold.Handle(cfg, "c", keyfold.HandlerFuncs[counterV1]{Event: func(k *keyfold.Key[counterV1], ev keyfold.Event) error {
			k.Set(counterV1{N: k.State().N + 1})
			return nil
		}})
	}
	v2 := func(cfg *keyfold.Config) error {
		h := keyfold.HandlerFuncs[counterV2]{Event: func(k *keyfold.Key[counterV2], ev keyfold.Event) error {
			st := k.State()
			st.Count++
			k.Set(st)
			return nil
		}}
		return keyfold.Handle(cfg, "c", h, keyfold.WithStateVersion(2, func(from uint32, data []byte) (counterV2, error) {
			var old counterV1
			if err := json.Unmarshal(data, &old); err != nil || from != 1 {
				return counterV2{}, fmt.Errorf("cannot upgrade from %d: %v", from, err)
			}
			return counterV2{Count: old.N, Note: "upgraded"}, nil
		}))
	}
	v3 := func(cfg *keyfold.Config) error {
		return keyfold.Handle(cfg, "c", keyfold.HandlerFuncs[counterV2]{}, keyfold.WithStateVersion[counterV2](3, nil))
	}
	ingest := func(node *keyfold.Node, n int) {
		for range n {
			if _, err := node.Ingest(ctx, "c", []json.RawMessage{json.RawMessage(`{"k":"a"}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	node, stop := runNode(t, cfgOf(v1))
	ingest(node, 3)
	stop()

	node, stop = runNode(t, cfgOf(v2))
	ingest(node, 1)
	st, err := node.Query(ctx, "c", "a")
	if err != nil || string(st.State) != `{"count":4,"note":"upgraded"}` {
		t.Fatalf("after the upgrade: %s, %v", st.State, err)
	}
	stop()

	node, stop = runNode(t, cfgOf(v3))
	if _, err := node.Query(ctx, "c", "a"); !errors.Is(err, keyfold.ErrUnavailable) {
		t.Errorf("version 3 reading a version-2 state: %v, want ErrUnavailable", err)
	}
	stop()

	node, stop = runNode(t, cfgOf(v2))
	defer stop()
	st, err = node.Query(ctx, "c", "a")
	if err != nil || string(st.State) != `{"count":4,"note":"upgraded"}` {
		t.Fatalf("version 2 again: %s, %v", st.State, err)
	}
}

// TestHandleErrors: Handle refuses what it cannot register.
func TestHandleErrors(t *testing.T) {
	cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{"p": {Key: "k"}}}
	if err := keyfold.Handle(&cfg, "nope", reminder{}); !errors.Is(err, keyfold.ErrUnknownPipeline) {
		t.Errorf("unknown pipeline: %v", err)
	}
	if err := keyfold.Handle(&cfg, "p", reminder{}, keyfold.WithStateVersion[reminderState](0, nil)); err == nil {
		t.Error("version 0 accepted")
	}
	if err := keyfold.Handle(&cfg, "p", reminder{}); err != nil {
		t.Fatal(err)
	}
	if err := keyfold.Handle(&cfg, "p", reminder{}); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("second handler: %v", err)
	}
}

// TestCodecs: the JSON and protobuf codecs round-trip; an upgrade reads a
// state an older version of the handler stored.
func TestCodecs(t *testing.T) {
	pc := keyfold.ProtoCodec[*structpb.Struct]()
	in, err := structpb.NewStruct(map[string]any{"items": 3.0, "name": "cart"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := pc.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pc.Decode(b)
	if err != nil || out.Fields["name"].GetStringValue() != "cart" || out.Fields["items"].GetNumberValue() != 3 {
		t.Fatalf("protobuf round trip: %v, %v", out, err)
	}
	jc := keyfold.JSONCodec[reminderState]()
	b, err = jc.Encode(reminderState{Events: 4, Fired: true})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := jc.Decode(b); err != nil || st != (reminderState{Events: 4, Fired: true}) {
		t.Fatalf("JSON round trip: %+v, %v", st, err)
	}
}

// TestHandlerStateOverHTTPAndGRPC: a key's handler state (a protobuf
// message here) shows as JSON beside the built-in aggregates in the HTTP
// and gRPC state queries, with the handler's failures, which /metrics
// counts too.
func TestHandlerStateOverHTTPAndGRPC(t *testing.T) {
	cfg := keyfold.Config{
		HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", DataDir: t.TempDir(), KeyGroups: 8,
		Pipelines: map[string]keyfold.PipelineConfig{"p": {Key: "k", Aggregates: map[string]keyfold.AggregateConfig{"n": {Op: "count"}}}},
	}
	h := keyfold.HandlerFuncs[*structpb.Struct]{Event: func(k *keyfold.Key[*structpb.Struct], ev keyfold.Event) error {
		var e struct{ Item string }
		if err := ev.Decode(&e); err != nil {
			return err
		}
		if e.Item == "" {
			return errors.New("no item")
		}
		st := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		if k.Exists() {
			st = proto.Clone(k.State()).(*structpb.Struct) // changed on a copy
		}
		st.Fields["items"] = structpb.NewNumberValue(st.Fields["items"].GetNumberValue() + 1)
		st.Fields["last"] = structpb.NewStringValue(e.Item)
		k.Set(st)
		return nil
	}}
	if err := keyfold.Handle(&cfg, "p", h, keyfold.WithCodec(keyfold.ProtoCodec[*structpb.Struct]())); err != nil {
		t.Fatal(err)
	}
	n := run(t, cfg)
	ctx := context.Background()
	if _, err := n.Ingest(ctx, "p", []json.RawMessage{
		json.RawMessage(`{"k":"a","item":"apple"}`), json.RawMessage(`{"k":"a"}`), json.RawMessage(`{"k":"a","item":"pear"}`),
	}); err != nil {
		t.Fatal(err)
	}
	get := func(path string) string {
		resp, err := http.Get("http://" + n.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s %v", path, resp.StatusCode, b, err)
		}
		return string(b)
	}
	var st struct {
		Aggregates      map[string]any  `json:"aggregates"`
		State           json.RawMessage `json:"state"`
		HandlerFailures uint64          `json:"handler_failures"`
	}
	if err := json.Unmarshal([]byte(get("/v1/pipelines/p/keys/a")), &st); err != nil {
		t.Fatal(err)
	}
	wantState := `{"items":2,"last":"pear"}`
	if compactJSON(t, st.State) != wantState || st.Aggregates["n"] != float64(3) || st.HandlerFailures != 1 {
		t.Errorf("HTTP state: %+v (state %s)", st, st.State)
	}

	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := keyfoldv1.NewKeyfoldClient(conn).GetState(ctx, &keyfoldv1.GetStateRequest{Pipeline: "p", Key: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if compactJSON(t, resp.StateJson) != wantState || string(resp.Aggregates["n"]) != "3" || resp.HandlerFailures != 1 {
		t.Errorf("gRPC state: %v", resp)
	}
	if m := get("/metrics"); !strings.Contains(m, `keyfold_pipeline_handler_failures_total{pipeline="p"} 1`) {
		t.Errorf("/metrics has no handler failure counted")
	}
}

// compactJSON re-encodes JSON without spaces (protojson may add some).
func compactJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// pinger sets a processing-time timer 2 s after each key's first event;
// when it fires it emits and records it.
type pinger struct{}

func (pinger) OnEvent(k *keyfold.Key[reminderState], ev keyfold.Event) error {
	st := k.State()
	if st.Events == 0 {
		if err := k.SetProcessingTimer("ping", k.Now().Add(2*time.Second)); err != nil {
			return err
		}
	}
	st.Events++
	k.Set(st)
	return nil
}

func (pinger) OnTimer(k *keyfold.Key[reminderState], t keyfold.Timer) error {
	if !t.Processing || t.Name != "ping" {
		return fmt.Errorf("timer %+v", t)
	}
	st := k.State()
	st.Fired = true
	k.Set(st)
	return k.Emit("pinged", map[string]any{"late": k.Now().Sub(t.Time) >= 0})
}

// TestProcessingTimersFireForQuietKeys: processing-time timers fire by the
// node's clock in a pipeline whose watermark never moves with it (a time
// field, idle_timeout 1h, no later event), for keys that get no other
// input, were passivated out of memory, and whose node restarted
// meanwhile; each fires once.
func TestProcessingTimersFireForQuietKeys(t *testing.T) {
	dir := t.TempDir()
	newCfg := func() keyfold.Config {
		cfg := keyfold.Config{
			DataDir: dir, CheckpointInterval: 50 * time.Millisecond, MaxActiveKeys: 2, MaxMemory: 1,
			Pipelines: map[string]keyfold.PipelineConfig{"p": {Key: "k", Time: "at", IdleTimeout: time.Hour}},
		}
		if err := keyfold.Handle(&cfg, "p", pinger{}); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	node, stop := runNode(t, newCfg())
	ctx := context.Background()
	const keys = 12
	var batch []json.RawMessage
	for i := range keys {
		batch = append(batch, json.RawMessage(fmt.Sprintf(`{"k":"k%d","at":"2020-01-01T00:00:00Z"}`, i)))
	}
	if _, err := node.Ingest(ctx, "p", batch); err != nil {
		t.Fatal(err)
	}
	stop()

	node, stop = runNode(t, newCfg())
	defer stop()
	ids := map[string]string{}
	eventually(t, "every key's processing-time timer fired", func() bool {
		outs, err := node.Outputs(ctx, "p", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			if o.Name != "pinged" || string(o.Values) != `{"late":true}` {
				t.Fatalf("output %+v %s", o, o.Values)
			}
			if prev, ok := ids[o.Key]; ok && prev != o.ID {
				t.Fatalf("%s fired twice: %s and %s", o.Key, prev, o.ID)
			}
			ids[o.Key] = o.ID
		}
		return len(ids) == keys
	})
	st, err := node.Query(ctx, "p", "k3")
	if err != nil || string(st.State) != `{"events":1,"fired":true}` {
		t.Fatalf("k3: %s %v", st.State, err)
	}
}
