package grpcapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi"
	"github.com/keyfold/keyfold/services/grpcapi/client"
	"github.com/keyfold/keyfold/services/servicetest"
)

// A pipeline whose keys emit a result per half second they saw events in.
// Without a time field event time is ingest time and the watermark is the
// node's clock: a window's result is stored within about a second of its
// end.
// The window is set in Go, so that these tests do not depend on ParseConfig
// reading windows: (the keyfold package's tests check that).
const windowedYAML = `
pipelines:
  taps:
    key: user
    aggregates:
      n: { op: count }
`

func windowedConfig(t *testing.T) keyfold.Config {
	cfg := servicetest.Config(t, windowedYAML)
	p := cfg.Pipelines["taps"]
	p.Windows = map[string]fold.WindowSpec{"tick": {Type: "tumbling", Size: 500 * time.Millisecond}}
	cfg.Pipelines["taps"] = p
	cfg.GRPCAddr = "127.0.0.1:0"
	return cfg
}

// tap ingests one event for each of keys, in one batch (so, mostly, in one
// window).
func tap(t *testing.T, c *client.Client, keys []string) {
	t.Helper()
	events := make([][]byte, len(keys))
	for i, k := range keys {
		events[i] = fmt.Appendf(nil, `{"user":%q}`, k)
	}
	if r, err := c.Ingest(t.Context(), "taps", events); err != nil || r.Accepted != len(keys) {
		t.Fatalf("Ingest = %+v, %v", r, err)
	}
}

func keyNames(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return keys
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allOutputs reads every stored output, page by page.
func allOutputs(t *testing.T, c *client.Client) []*keyfoldv1.OutputEntry {
	t.Helper()
	var all []*keyfoldv1.OutputEntry
	after := ""
	for {
		page, next, err := c.Outputs(t.Context(), "taps", after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return all
		}
		all, after = append(all, page...), next
	}
}

// waitOutputs waits until at least n outputs are stored and returns them.
func waitOutputs(t *testing.T, c *client.Client, n int) []*keyfoldv1.OutputEntry {
	t.Helper()
	var all []*keyfoldv1.OutputEntry
	waitFor(t, 15*time.Second, fmt.Sprintf("%d outputs", n), func() bool {
		all = allOutputs(t, c)
		return len(all) >= n
	})
	return all
}

func cursors(es []*keyfoldv1.OutputEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Cursor
	}
	return out
}

// collector gathers what a subscription delivers.
type collector struct {
	mu    sync.Mutex
	got   []*keyfoldv1.OutputEntry
	onAdd func(got int) // if set, called after each entry, with the count
}

func (c *collector) add(e *keyfoldv1.OutputEntry) error {
	c.mu.Lock()
	c.got = append(c.got, e)
	got := len(c.got)
	c.mu.Unlock()
	if c.onAdd != nil {
		c.onAdd(got)
	}
	return nil
}

func (c *collector) entries() []*keyfoldv1.OutputEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// subscribe runs c.Subscribe in the background until the test ends or the
// returned cancel is called; wait returns Subscribe's error.
func subscribe(t *testing.T, c *client.Client, after string, col *collector) (cancel func(), wait func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- c.Subscribe(ctx, "taps", after, col.add) }()
	t.Cleanup(cancel)
	return cancel, func() error {
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Subscribe did not return 10s after its context ended")
			return nil
		}
	}
}

// TestListOutputs: window results read page by page, as the node's Go API
// (and so the HTTP API) returns them; the default and largest page; the
// requests refused.
func TestListOutputs(t *testing.T) {
	n := servicetest.Run(t, windowedConfig(t))
	c := dial(t, n.GRPCAddr(), client.Options{})
	ctx := t.Context()

	if page, next, err := c.Outputs(ctx, "taps", "", 0); err != nil || len(page) != 0 || next != "" {
		t.Fatalf("Outputs before any = %v, %q, %v", page, next, err)
	}
	keys := keyNames("u", 120)
	tap(t, c, keys)
	// GetState shows a windowed key's event-time state as HTTP does.
	st, err := c.GetState(ctx, "taps", keys[0])
	if err != nil {
		t.Fatal(err)
	}
	var tm struct {
		Late    *uint64 `json:"late"`
		Windows []struct {
			Name string `json:"name"`
		} `json:"windows"`
	}
	if err := json.Unmarshal(st.Time, &tm); err != nil || tm.Late == nil || tm.Windows == nil {
		t.Errorf("GetState of a windowed key: time %s (%v)", st.Time, err)
	}
	all := waitOutputs(t, c, len(keys))

	seen := map[string]bool{}
	for _, e := range all {
		o := e.Output
		if e.Cursor == "" || e.StoredMs <= 0 || o.Pipeline != "taps" || o.Kind != "tumbling" || o.Name != "tick" ||
			o.EndMs-o.StartMs != 500 || o.Revision != 0 || o.Count != 1 || string(o.ValuesJson) != `{"n":1}` || o.WatermarkMs < o.EndMs {
			t.Errorf("output %v", e)
		}
		seen[o.Key] = true
	}
	for _, k := range keys {
		if !seen[k] {
			t.Errorf("no output of key %s", k)
		}
	}

	// The same outputs, cursors and values as the node's Go API.
	goAPI, err := n.Outputs(ctx, "taps", "", 1000)
	if err != nil || len(goAPI) != len(all) {
		t.Fatalf("Node.Outputs = %d outputs, %v; gRPC %d", len(goAPI), err, len(all))
	}
	for i, o := range goAPI {
		e := all[i]
		if e.Cursor != o.Cursor || e.Output.Id != o.ID || e.Output.Key != o.Key || string(e.Output.ValuesJson) != string(o.Values) ||
			e.Output.StartMs != o.Start.UnixMilli() || e.StoredMs != o.Stored.UnixMilli() {
			t.Errorf("output %d: gRPC %v, Go API %+v", i, e, o)
		}
	}

	// Paging: pages of the limit, each next the last cursor, an empty page
	// at the end whose next is the cursor asked after.
	var paged []*keyfoldv1.OutputEntry
	after := ""
	for i := 0; ; i++ {
		page, next, err := c.Outputs(ctx, "taps", after, 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			if next != after || after != all[len(all)-1].Cursor {
				t.Errorf("empty page: next %q, after %q", next, after)
			}
			break
		}
		if len(page) > 50 || next != page[len(page)-1].Cursor {
			t.Fatalf("page %d: %d outputs, next %q", i, len(page), next)
		}
		paged, after = append(paged, page...), next
	}
	if !slices.Equal(cursors(paged), cursors(all)) {
		t.Errorf("pages of 50 give %d outputs, one read %d", len(paged), len(all))
	}
	if page, _, err := c.Outputs(ctx, "taps", "", 0); err != nil || len(page) != grpcapi.DefaultOutputsLimit {
		t.Errorf("limit 0: %d outputs, %v; want the default %d", len(page), err, grpcapi.DefaultOutputsLimit)
	}
	if page, _, err := c.Outputs(ctx, "taps", "", 10_000); err != nil || len(page) != len(all) {
		t.Errorf("limit 10000: %d outputs, %v", len(page), err)
	}

	// Refusals.
	_, _, err = c.Outputs(ctx, "", "", 10)
	if ce := wantCode(t, "empty pipeline", err, codes.InvalidArgument); ce.Field != "pipeline" || ce.EventIndex != -1 {
		t.Errorf("empty pipeline: field %q, index %d", ce.Field, ce.EventIndex)
	}
	_, _, err = c.Outputs(ctx, "taps", "", 10_001)
	if ce := wantCode(t, "limit 10001", err, codes.InvalidArgument); ce.Field != "limit" {
		t.Errorf("limit 10001: field %q", ce.Field)
	}
	_, _, err = c.Outputs(ctx, "nope", "", 10)
	wantCode(t, "unknown pipeline", err, codes.NotFound)
	_, _, err = c.Outputs(ctx, "taps", "not-a-cursor", 10)
	wantCode(t, "bad cursor", err, codes.InvalidArgument)
	if _, _, err := c.Outputs(ctx, "taps", "", -1); err == nil {
		t.Error("a negative limit was sent")
	}
}

// TestSubscribe: a subscription gets what is stored, then what is stored
// while it runs, in the order of the log; cancelled and resumed from the
// cursor of the last entry handled, it gets exactly the rest.
func TestSubscribe(t *testing.T) {
	n := servicetest.Run(t, windowedConfig(t))
	c := dial(t, n.GRPCAddr(), client.Options{})

	var live collector
	stopLive, waitLive := subscribe(t, c, "", &live) // before anything is stored
	tap(t, c, keyNames("a", 30))
	first := waitOutputs(t, c, 30)
	waitFor(t, 10*time.Second, "the live subscription", func() bool { return len(live.entries()) >= len(first) })

	// Stop after 12 entries (fn's error ends Subscribe, which returns
	// it), resume from the 12th.
	var head collector
	errStop := errors.New("twelve")
	err := c.Subscribe(t.Context(), "taps", "", func(e *keyfoldv1.OutputEntry) error {
		head.add(e)
		if len(head.entries()) == 12 {
			return errStop
		}
		return nil
	})
	if err != errStop {
		t.Fatalf("Subscribe returned %v, want fn's error", err)
	}
	var rest collector
	_, _ = subscribe(t, c, head.entries()[11].Cursor, &rest)
	tap(t, c, keyNames("b", 20)) // live, after the resumption
	all := waitOutputs(t, c, 50)
	waitFor(t, 10*time.Second, "the resumed subscription", func() bool { return len(rest.entries()) >= len(all)-12 })
	waitFor(t, 10*time.Second, "the live subscription", func() bool { return len(live.entries()) >= len(all) })

	if got, want := cursors(append(head.entries(), rest.entries()...)), cursors(all); !slices.Equal(got, want) {
		t.Errorf("12 then the rest: %d entries, the log %d: %v\nvs %v", len(got), len(want), got, want)
	}
	if got := cursors(live.entries()); !slices.Equal(got, cursors(all)) {
		t.Errorf("the live subscription: %v\nthe log: %v", got, cursors(all))
	}
	stopLive()
	if err := waitLive(); err != nil {
		t.Errorf("Subscribe after its context ended = %v, want nil", err)
	}
	var values map[string]float64
	if e := rest.entries()[0]; json.Unmarshal(e.Output.ValuesJson, &values) != nil || values["n"] != 1 || e.Output.Name != "tick" {
		t.Errorf("entry %v", e)
	}

	// Refusals end Subscribe at once (they are not retried).
	for _, tc := range []struct {
		pipeline, after string
		code            codes.Code
	}{{"", "", codes.InvalidArgument}, {"nope", "", codes.NotFound}, {"taps", "not-a-cursor", codes.InvalidArgument}} {
		err := c.Subscribe(t.Context(), tc.pipeline, tc.after, func(*keyfoldv1.OutputEntry) error { return nil })
		wantCode(t, fmt.Sprintf("Subscribe(%q, %q)", tc.pipeline, tc.after), err, tc.code)
	}
}

// TestSubscribeResumesAfterBrokenConnection: the connection drops in the
// middle of a subscription's backlog, and again while it waits for new
// results; each time the client subscribes again after the last entry it
// delivered, and fn sees every output once, in order.
func TestSubscribeResumesAfterBrokenConnection(t *testing.T) {
	n := servicetest.Run(t, windowedConfig(t))
	direct := dial(t, n.GRPCAddr(), client.Options{})
	tap(t, direct, keyNames("c", 200))
	waitOutputs(t, direct, 200)

	p := startProxy(t, n.GRPCAddr())
	var opened, accepted atomic.Int32 // Subscribe streams
	c := dial(t, p.ln.Addr().String(), client.Options{DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			opened.Add(1)
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return headerWatch{s, &accepted}, nil
		})}})
	col := collector{onAdd: func(got int) {
		if got == 20 {
			p.cut() // entries sent after this one may be lost with the connection
		}
	}}
	stop, wait := subscribe(t, c, "", &col)
	waitFor(t, 10*time.Second, "the backlog", func() bool { return len(col.entries()) >= 200 })
	// Once the node took the second subscription, cut it while it waits
	// for new results: only a third one can deliver them.
	waitFor(t, 10*time.Second, "the second subscription", func() bool { return accepted.Load() >= 2 })
	p.cut()
	tap(t, direct, keyNames("f", 30))
	all := waitOutputs(t, direct, 230)
	waitFor(t, 15*time.Second, "the new results", func() bool { return len(col.entries()) >= len(all) })
	stop()
	if err := wait(); err != nil {
		t.Fatalf("Subscribe = %v", err)
	}
	if got := cursors(col.entries()); !slices.Equal(got, cursors(all)) {
		t.Errorf("%d entries, want the log's %d in order", len(got), len(all))
	}
	if o, a := opened.Load(), accepted.Load(); o < 3 || a < 3 {
		t.Errorf("%d Subscribe streams opened, %d accepted; want at least 3 (two cuts)", o, a)
	}
}

// headerWatch counts the streams whose response headers arrived (the node
// accepted the call).
type headerWatch struct {
	grpc.ClientStream
	accepted *atomic.Int32
}

func (h headerWatch) Header() (metadata.MD, error) {
	md, err := h.ClientStream.Header()
	if md != nil {
		h.accepted.Add(1)
	}
	return md, err
}

// TestSubscribeAcrossRestart: a node draining ends its subscriptions
// promptly (Unavailable) instead of holding its shutdown; the client keeps
// trying, and once a node serves the same store again it resumes where it
// was and gets the new results.
func TestSubscribeAcrossRestart(t *testing.T) {
	cfg := windowedConfig(t)
	cfg.ShutdownTimeout = time.Minute // a held shutdown would show
	n1, errc := servicetest.Start(t, cfg)
	addr := n1.GRPCAddr()
	c := dial(t, addr, client.Options{})
	tap(t, c, keyNames("d", 10))
	before := waitOutputs(t, c, 10)

	var col collector
	stop, wait := subscribe(t, c, "", &col)
	waitFor(t, 10*time.Second, "the subscription", func() bool { return len(col.entries()) == len(before) })
	start := time.Now()
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the node took %v to stop with a subscription open", took)
	}

	cfg.GRPCAddr = addr // the same address, the same data
	servicetest.Run(t, cfg)
	tap(t, c, keyNames("e", 10))
	all := waitOutputs(t, c, 20)
	waitFor(t, 20*time.Second, "the resumed subscription", func() bool { return len(col.entries()) >= len(all) })
	stop()
	if err := wait(); err != nil {
		t.Fatalf("Subscribe = %v", err)
	}
	if got := cursors(col.entries()); !slices.Equal(got, cursors(all)) {
		t.Errorf("across the restart: %v\nthe log: %v", got, cursors(all))
	}
}
