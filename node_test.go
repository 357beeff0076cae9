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

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/persistence/faultstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
	"github.com/keyfold/keyfold/services/servicetest"
)

func testConfig(t *testing.T, dir string) keyfold.Config {
	t.Helper()
	cfg, err := keyfold.ParseConfig([]byte(`
pipelines:
  p:
    key: k
    id: id
    aggregates:
      n: { op: count }
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = dir
	cfg.KeyGroups = 8
	return cfg
}

func start(t testing.TB, cfg keyfold.Config) (*keyfold.Node, chan error) {
	t.Helper()
	return servicetest.Start(t, cfg)
}

func run(t testing.TB, cfg keyfold.Config) *keyfold.Node {
	t.Helper()
	return servicetest.Run(t, cfg)
}

func TestNodeLifecycle(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	n, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Ingest(context.Background(), "p", nil); !errors.Is(err, keyfold.ErrNotReady) {
		t.Errorf("Ingest before Run: %v, want ErrNotReady", err)
	}
	if n.Serving() {
		t.Error("Serving before Run")
	}
	errc := make(chan error, 1)
	go func() { errc <- n.Run(context.Background()) }()
	<-n.Ready()
	if !n.Serving() {
		t.Error("not Serving once Ready")
	}
	if n.HTTPAddr() != "" {
		t.Errorf("HTTPAddr = %q with no HTTP configured", n.HTTPAddr())
	}
	res, err := n.Ingest(context.Background(), "p", []json.RawMessage{[]byte(`{"k":"a","id":"1"}`), []byte(`{"k":"a","id":"1"}`)})
	if err != nil || res != (keyfold.IngestResult{Accepted: 1, Duplicates: 1}) {
		t.Fatalf("Ingest = %+v, %v", res, err)
	}
	if err := n.Run(context.Background()); err == nil {
		t.Error("second Run returned nil")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := n.Ingest(context.Background(), "p", []json.RawMessage{[]byte(`{"k":"a"}`)}); err == nil {
		t.Error("Ingest after Close succeeded")
	}

	// The state survives a restart.
	n2 := run(t, cfg)
	st, err := n2.Query(context.Background(), "p", "a")
	if err != nil || st.Seq != 1 || st.Aggregates["n"] != uint64(1) {
		t.Fatalf("after restart: %+v, %v", st, err)
	}
}

func TestCloseBeforeRun(t *testing.T) {
	n, err := keyfold.New(testConfig(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Run(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run after Close did not return")
	}
}

// TestKeyGroupsFixed: a store created with one number of key groups refuses
// a node configured with another.
func TestKeyGroupsFixed(t *testing.T) {
	dir := t.TempDir()
	n, errc := start(t, testConfig(t, dir))
	n.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, dir)
	cfg.KeyGroups = 16
	n2, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = n2.Run(context.Background())
	if !errors.Is(err, persistence.ErrGroupsMismatch) {
		t.Fatalf("Run with another key group count: %v, want ErrGroupsMismatch", err)
	}
}

// TestKeyGroupsFromTheStore: a node whose configuration leaves key_groups
// unset runs with the number its store records (here 8, set when the store
// was created), with the keys it stored; a new store gets the default.
func TestKeyGroupsFromTheStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n, errc := start(t, testConfig(t, dir)) // key_groups 8
	if _, err := n.Ingest(ctx, "p", []json.RawMessage{[]byte(`{"k":"a","id":"1"}`)}); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	groups := func(n *keyfold.Node) uint32 {
		t.Helper()
		info, err := n.Cluster(ctx, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return info.KeyGroups
	}
	cfg := testConfig(t, dir)
	cfg.KeyGroups = 0
	again := run(t, cfg)
	if g := groups(again); g != 8 {
		t.Errorf("key groups on a store of 8, unset in the configuration: %d", g)
	}
	if st, err := again.Query(ctx, "p", "a"); err != nil || st.Seq != 1 {
		t.Errorf("a = %+v, %v; want seq 1", st, err)
	}
	fresh := testConfig(t, t.TempDir())
	fresh.KeyGroups = 0
	if g := groups(run(t, fresh)); g != keyfold.DefaultKeyGroups {
		t.Errorf("key groups of a new store, unset in the configuration: %d, want %d", g, keyfold.DefaultKeyGroups)
	}
}

// TestSecondNodeOnSameDirRefused: the embedded store locks its directory.
func TestSecondNodeOnSameDirRefused(t *testing.T) {
	dir := t.TempDir()
	run(t, testConfig(t, dir))
	n2, err := keyfold.New(testConfig(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Run(context.Background()); err == nil {
		t.Fatal("a second node on the same data directory started")
	}
}

// TestHealthDuringRecovery: HTTP is served from the start: /healthz is 200
// while the node recovers, /readyz and the API are 503 until it is done.
func TestHealthDuringRecovery(t *testing.T) {
	dir := t.TempDir()
	inner, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs := faultstore.New(inner)
	fs.Inject(faultstore.OpCheckGroups, 1, faultstore.Fault{Delay: time.Hour}) // until the context ends
	cfg := testConfig(t, dir)
	cfg.Store = fs
	cfg.HTTPAddr = "127.0.0.1:0"
	n, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- n.Run(ctx) }()

	var base string
	eventually(t, "HTTP listening", func() bool { base = n.HTTPAddr(); return base != "" })
	base = "http://" + base
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/healthz", 200},
		{"GET", "/readyz", 503},
		{"POST", "/v1/pipelines/p/events", 503},
		{"GET", "/v1/pipelines/p/keys/a", 503},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(`[{"k":"a"}]`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s during recovery: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
	cancel() // stopping during recovery is a clean stop
	if err := <-errc; err != nil {
		t.Fatalf("Run stopped during recovery: %v", err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMetrics: /metrics serves the node's counters and the HTTP
// instruments, labelled by route pattern.
func TestMetrics(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.HTTPAddr = "127.0.0.1:0"
	n := run(t, cfg)
	base := "http://" + n.HTTPAddr()
	resp, err := http.Post(base+"/v1/pipelines/p/events", "application/json",
		strings.NewReader(`[{"k":"a","id":"1"},{"k":"a","id":"1"},{"k":"b"}]`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"keyfold_events_applied_total 3",
		"keyfold_duplicates_total 1",
		`keyfold_pipeline_events_applied_total{pipeline="p"} 3`,
		`keyfold_pipeline_duplicates_total{pipeline="p"} 1`,
		"keyfold_active_keys 2",
		`keyfold_http_requests_total{code="200",method="POST",route="POST /v1/pipelines/{pipeline}/events"} 1`,
		`keyfold_http_request_duration_seconds_count{route="POST /v1/pipelines/{pipeline}/events"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestNodeOnRedisCluster: a node keeps its state in a real 3-master Redis
// Cluster (Config.RedisCluster, the seeds in the URL) and a second node on
// the same cluster recovers it.
func TestNodeOnRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	cfg := testConfig(t, t.TempDir())
	cfg.Redis = fmt.Sprintf("redis://%s?addr=%s&addr=%s", addrs[0], addrs[1], addrs[2])
	cfg.RedisCluster = true
	n, errc := start(t, cfg)
	for i := range 40 {
		raw := []json.RawMessage{fmt.Appendf(nil, `{"k":"key%d","id":"%d"}`, i%10, i)}
		if _, err := n.Ingest(context.Background(), "p", raw); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	n2 := run(t, cfg)
	for k := range 10 {
		st, err := n2.Query(context.Background(), "p", fmt.Sprint("key", k))
		if err != nil || st.Seq != 4 {
			t.Errorf("key%d after a restart on the cluster: %+v, %v", k, st, err)
		}
	}
	cfg.Redis = ""
	if err := cfg.Validate(); err == nil {
		t.Error("redis_cluster without redis validated")
	}
}
