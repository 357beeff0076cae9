package keyfold_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/servicetest"
)

// basket is a small shopping cart answering calls: add an item, see the
// cart, check out (which empties it); events count the views.
type basket struct{}

type basketState struct {
	Items map[string]int `json:"items,omitempty"`
	Views int            `json:"views,omitempty"`
}

type basketRequest struct {
	Op   string `json:"op"`
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

func (basket) OnEvent(k *keyfold.Key[basketState], ev keyfold.Event) error {
	st := k.State()
	st.Views++
	k.Set(st)
	return nil
}

func (basket) OnTimer(*keyfold.Key[basketState], keyfold.Timer) error { return nil }

func (basket) OnCall(k *keyfold.Key[basketState], req keyfold.Request) (any, error) {
	var r basketRequest
	if err := req.Decode(&r); err != nil {
		return nil, err
	}
	st := k.State()
	st.Items = maps.Clone(st.Items) // changed on a copy
	switch r.Op {
	case "add":
		if r.Item == "" || r.Qty <= 0 {
			return nil, errors.New("add needs an item and a quantity")
		}
		if st.Items == nil {
			st.Items = map[string]int{}
		}
		st.Items[r.Item] += r.Qty
		k.Set(st)
	case "get":
	case "checkout":
		if len(st.Items) == 0 {
			return nil, errors.New("the cart is empty")
		}
		n := 0
		for _, q := range st.Items {
			n += q
		}
		if err := k.Emit("order", map[string]any{"items": n, "at": k.Now()}); err != nil {
			return nil, err
		}
		k.Delete()
		return map[string]any{"ordered": n}, nil
	case "sneak": // a read-only call that tries to change the cart
		st.Items = map[string]int{"sneaked": 1}
		k.Set(st)
	default:
		return nil, errors.New("unknown op " + r.Op)
	}
	return st, nil
}

func basketConfig(t *testing.T, dir string) keyfold.Config {
	t.Helper()
	cfg := keyfold.Config{
		DataDir: dir, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", KeyGroups: 8,
		Pipelines: map[string]keyfold.PipelineConfig{
			"cart":  {Key: "k"},
			"plain": {Key: "k"},
		},
	}
	if err := keyfold.Handle(&cfg, "cart", basket{}); err != nil {
		t.Fatal(err)
	}
	// A handler without Call takes no calls.
	if err := keyfold.Handle(&cfg, "plain", keyfold.HandlerFuncs[int]{}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestCall: a call is answered once applied; with an id a retry gets the
// first reply without running the handler again, also after a restart and
// after the handler deleted the key; a
// handler's error is the call's, and changes nothing; a read-only call
// reads and may not change; a key of calls only has a state to query; bad
// requests are refused before anything is logged.
func TestCall(t *testing.T) {
	dir := t.TempDir()
	node, stop := runNode(t, basketConfig(t, dir))
	ctx := context.Background()
	call := func(key, req string, o keyfold.CallOptions) (keyfold.CallResult, error) {
		return node.Call(ctx, "cart", key, json.RawMessage(req), o)
	}
	r, err := call("u1", `{"op":"add","item":"apple","qty":2}`, keyfold.CallOptions{ID: "a1"})
	if err != nil || string(r.Reply) != `{"items":{"apple":2}}` || r.Duplicate {
		t.Fatalf("add: %s %v %v", r.Reply, r.Duplicate, err)
	}
	r, err = call("u1", `{"op":"add","item":"apple","qty":2}`, keyfold.CallOptions{ID: "a1"})
	if err != nil || string(r.Reply) != `{"items":{"apple":2}}` || !r.Duplicate {
		t.Fatalf("retry of add: %s %v %v, want the first reply again", r.Reply, r.Duplicate, err)
	}
	if _, err := call("u1", `{"op":"add","item":"pear","qty":1}`, keyfold.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	// The handler's error: the caller's, the key unchanged, and kept for
	// a retry with its id.
	for range 2 {
		_, err = call("u1", `{"op":"add","item":"plum"}`, keyfold.CallOptions{ID: "bad"})
		var ce *keyfold.CallError
		if !errors.Is(err, keyfold.ErrCallFailed) || !errors.As(err, &ce) || ce.Msg != "add needs an item and a quantity" {
			t.Fatalf("a failing call: %v", err)
		}
	}
	// Read-only: reads what is logged; may not change the key.
	r, err = call("u1", `{"op":"get"}`, keyfold.CallOptions{ReadOnly: true})
	if err != nil || string(r.Reply) != `{"items":{"apple":2,"pear":1}}` {
		t.Fatalf("read-only get: %s %v", r.Reply, err)
	}
	if _, err = call("u1", `{"op":"sneak"}`, keyfold.CallOptions{ReadOnly: true}); !errors.Is(err, keyfold.ErrCallFailed) || !strings.Contains(err.Error(), "read-only call cannot set the state") {
		t.Fatalf("a read-only call that sets the state: %v", err)
	}
	st, err := node.Query(ctx, "cart", "u1")
	if err != nil || string(st.State) != `{"items":{"apple":2,"pear":1}}` || st.Seq != 0 {
		t.Fatalf("the key of calls only: %s seq %d, %v", st.State, st.Seq, err)
	}
	// Refused before anything is logged.
	for _, c := range []struct {
		pipeline, key, req string
		o                  keyfold.CallOptions
		want               error
	}{
		{"nope", "u1", `{}`, keyfold.CallOptions{}, keyfold.ErrUnknownPipeline},
		{"plain", "u1", `{}`, keyfold.CallOptions{}, keyfold.ErrNoCallHandler},
		{"cart", "u1", `{"op":`, keyfold.CallOptions{}, keyfold.ErrInvalidCall},
		{"cart", "", `{}`, keyfold.CallOptions{}, keyfold.ErrInvalidCall},
		{"cart", "u1", `{}`, keyfold.CallOptions{ID: "x", ReadOnly: true}, keyfold.ErrInvalidCall},
		{"cart", "u1", `{}`, keyfold.CallOptions{ID: strings.Repeat("x", keyfold.MaxCallIDBytes+1)}, keyfold.ErrInvalidCall},
		{"cart", "u1", `"` + strings.Repeat("x", keyfold.MaxRequestBytes) + `"`, keyfold.CallOptions{}, keyfold.ErrCallTooLarge},
	} {
		if _, err := node.Call(ctx, c.pipeline, c.key, json.RawMessage(c.req), c.o); !errors.Is(err, c.want) {
			t.Errorf("call %s/%q %.20s %+v: %v, want %v", c.pipeline, c.key, c.req, c.o, err, c.want)
		}
	}
	stop()

	node, stop = runNode(t, basketConfig(t, dir))
	defer stop()
	r, err = call("u1", `{"op":"add","item":"apple","qty":2}`, keyfold.CallOptions{ID: "a1"})
	if err != nil || string(r.Reply) != `{"items":{"apple":2}}` || !r.Duplicate {
		t.Fatalf("retry of add after a restart: %s %v %v, want the first reply again", r.Reply, r.Duplicate, err)
	}
	// A checkout deletes the key, and keeps its reply for a retry.
	for i := range 2 {
		r, err = call("u1", `{"op":"checkout"}`, keyfold.CallOptions{ID: "pay"})
		if err != nil || string(r.Reply) != `{"ordered":3}` || r.Duplicate != (i == 1) {
			t.Fatalf("checkout %d: %s %v %v", i, r.Reply, r.Duplicate, err)
		}
	}
	// The deletion kept the replies: an add retried after it is answered,
	// not run again.
	r, err = call("u1", `{"op":"add","item":"apple","qty":2}`, keyfold.CallOptions{ID: "a1"})
	if err != nil || string(r.Reply) != `{"items":{"apple":2}}` || !r.Duplicate {
		t.Fatalf("retry of add after the checkout: %s %v %v, want the first reply again", r.Reply, r.Duplicate, err)
	}
	r, err = call("u1", `{"op":"get"}`, keyfold.CallOptions{ReadOnly: true})
	if err != nil || string(r.Reply) != `{}` {
		t.Fatalf("after the checkout: %s %v", r.Reply, err)
	}
	eventually(t, "the order is stored", func() bool {
		outs, err := node.Outputs(ctx, "cart", "", 10)
		if err != nil || len(outs) > 1 || len(outs) == 1 && outs[0].Name != "order" {
			t.Fatalf("outputs %v (%v), want one order", outs, err)
		}
		return len(outs) == 1
	})
}

// TestCallOverHTTPAndGRPC: the transports answer a call's reply, and the
// errors with clear statuses: unknown pipeline, no call handler, a body
// too large, bad JSON, the handler's error (the key unchanged).
func TestCallOverHTTPAndGRPC(t *testing.T) {
	node, stop := runNode(t, basketConfig(t, t.TempDir()))
	defer stop()
	const path = "/v1/pipelines/cart/keys/u%201/call"
	for _, c := range []struct {
		path, ct, body string
		status         int
		want           string
	}{
		{path, "application/json", `{"request":{"op":"add","item":"fig","qty":1},"id":"h1"}`, 200, `{"reply":{"items":{"fig":1}}}`},
		{path, "application/json", `{"request":{"op":"add","item":"fig","qty":1},"id":"h1"}`, 200, `{"reply":{"items":{"fig":1}},"duplicate":true}`},
		{path, "application/json", `{"request":{"op":"get"},"read_only":true}`, 200, `{"reply":{"items":{"fig":1}}}`},
		{path, "application/json", `{"request":{"op":"checkout"},"read_only":true}`, 422, `{"error":"call failed: a read-only call cannot emit an output"}`},
		{path, "application/json", `{"request":{"op":"add","item":"fig"}}`, 422, `{"error":"call failed: add needs an item and a quantity"}`},
		{path, "application/json", `{"request":{"op":"get"},"readOnly":true}`, 400, `{"error":"bad request: want {\"request\": …, \"id\": …, \"read_only\": …}: json: unknown field \"readOnly\""}`},
		{path, "application/json", `{"request":`, 400, ""},
		{path, "application/json", `{"request":"` + strings.Repeat("x", keyfold.MaxRequestBytes+8<<10) + `"}`, 413, ""},
		{path, "application/x-ndjson", `{}`, 415, ""},
		{"/v1/pipelines/nope/keys/u1/call", "application/json", `{}`, 404, `{"error":"unknown pipeline \"nope\""}`},
		{"/v1/pipelines/plain/keys/u1/call", "application/json", `{}`, 404, `{"error":"the pipeline's handler takes no calls: pipeline \"plain\""}`},
	} {
		status, body := post(t, node, c.path, c.ct, c.body)
		body = strings.TrimSpace(body)
		if status != c.status || (c.want != "" && body != c.want) {
			t.Errorf("POST %s %.60s: %d %.200s, want %d %s", c.path, c.body, status, body, c.status, c.want)
		}
	}
	st, err := node.Query(context.Background(), "cart", "u 1")
	if err != nil || string(st.State) != `{"items":{"fig":1}}` {
		t.Fatalf("after the HTTP calls: %s %v", st.State, err)
	}
	// Applied: h1, its retry, the read-only get and checkout, the failing add.
	if ps := node.Stats().Pipelines["cart"]; ps.Calls != 5 || ps.CallFailures != 2 {
		t.Errorf("calls counted %d, failed %d; want 5 and 2", ps.Calls, ps.CallFailures)
	}
	mr, err := http.Get("http://" + node.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	for _, want := range []string{`keyfold_pipeline_calls_total{pipeline="cart"} 5`, `keyfold_pipeline_call_failures_total{pipeline="cart"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}

	conn, err := grpc.NewClient(node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := keyfoldv1.NewKeyfoldClient(conn)
	ctx := context.Background()
	resp, err := api.Call(ctx, &keyfoldv1.CallRequest{Pipeline: "cart", Key: "u 1", Request: []byte(`{"op":"add","item":"fig","qty":1}`), Id: "h1"})
	if err != nil || !bytes.Equal(resp.Reply, []byte(`{"items":{"fig":1}}`)) || !resp.Duplicate {
		t.Fatalf("gRPC retry of h1: %v %v", resp, err)
	}
	for _, c := range []struct {
		req  *keyfoldv1.CallRequest
		code codes.Code
	}{
		{&keyfoldv1.CallRequest{Pipeline: "cart", Key: "u 1", Request: []byte(`{"op":"checkout"}`), Id: "g2"}, codes.OK},
		{&keyfoldv1.CallRequest{Pipeline: "cart", Key: "u 1", Request: []byte(`{"op":"checkout"}`), Id: "g3"}, codes.FailedPrecondition},
		{&keyfoldv1.CallRequest{Pipeline: "plain", Key: "u 1", Request: []byte(`{}`)}, codes.Unimplemented},
		{&keyfoldv1.CallRequest{Pipeline: "nope", Key: "u 1", Request: []byte(`{}`)}, codes.NotFound},
		{&keyfoldv1.CallRequest{Pipeline: "cart", Key: "u 1", Request: []byte(`{`)}, codes.InvalidArgument},
	} {
		if _, err := api.Call(ctx, c.req); status.Code(err) != c.code {
			t.Errorf("gRPC call %v: %v, want %v", c.req, err, c.code)
		}
	}
}

// TestClusterCall: two members; a call through either is answered by the
// key's owner (forwarded when the other owns it), a retry through the
// other member gets the kept reply, read-only calls and the handler's
// errors come back through the forwarding unchanged.
func TestClusterCall(t *testing.T) {
	srv := redistest.Start(t)
	addrs := []string{freeAddr(t), freeAddr(t)}
	var nodes []*keyfold.Node
	for _, addr := range addrs {
		cfg := basketConfig(t, "")
		cfg.DataDir, cfg.HTTPAddr = "", ""
		cfg.Redis, cfg.Cluster, cfg.GRPCAddr, cfg.Peers = srv.URL(), "t", addr, addrs
		nodes = append(nodes, servicetest.Run(t, cfg))
	}
	waitStable(t, nodes[1], 2)
	ctx := context.Background()
	const keys = 16
	for i := range keys {
		key := fmt.Sprintf("c%d", i)
		r, err := nodes[0].Call(ctx, "cart", key, json.RawMessage(fmt.Sprintf(`{"op":"add","item":"i%d","qty":%d}`, i, i+1)), keyfold.CallOptions{ID: "add"})
		if want := fmt.Sprintf(`{"items":{"i%d":%d}}`, i, i+1); err != nil || string(r.Reply) != want || r.Duplicate {
			t.Fatalf("%s through 0: %s %v %v, want %s", key, r.Reply, r.Duplicate, err, want)
		}
		r, err = nodes[1].Call(ctx, "cart", key, json.RawMessage(`{"op":"add","item":"x","qty":9}`), keyfold.CallOptions{ID: "add"})
		if want := fmt.Sprintf(`{"items":{"i%d":%d}}`, i, i+1); err != nil || string(r.Reply) != want || !r.Duplicate {
			t.Fatalf("%s retried through 1: %s %v %v, want the first reply %s", key, r.Reply, r.Duplicate, err, want)
		}
		for _, n := range nodes {
			r, err = n.Call(ctx, "cart", key, json.RawMessage(`{"op":"get"}`), keyfold.CallOptions{ReadOnly: true})
			if want := fmt.Sprintf(`{"items":{"i%d":%d}}`, i, i+1); err != nil || string(r.Reply) != want {
				t.Fatalf("%s read-only through %s: %s %v", key, n.GRPCAddr(), r.Reply, err)
			}
			var ce *keyfold.CallError
			if _, err := n.Call(ctx, "cart", key, json.RawMessage(`{"op":"add"}`), keyfold.CallOptions{}); !errors.As(err, &ce) || ce.Msg != "add needs an item and a quantity" {
				t.Fatalf("%s failing through %s: %v", key, n.GRPCAddr(), err)
			}
			if _, err := n.Call(ctx, "plain", key, json.RawMessage(`{}`), keyfold.CallOptions{}); !errors.Is(err, keyfold.ErrNoCallHandler) {
				t.Fatalf("%s to a pipeline without calls through %s: %v", key, n.GRPCAddr(), err)
			}
		}
	}
	// Each owner applied its own keys' calls: both some, none twice.
	calls := func(n *keyfold.Node) int64 { return n.Stats().Pipelines["cart"].Calls }
	if calls(nodes[0]) == 0 || calls(nodes[1]) == 0 {
		t.Errorf("calls applied: %d and %d, want both members some", calls(nodes[0]), calls(nodes[1]))
	}
	// Per key: two logged calls with the id, two read-only, two failing.
	if got := calls(nodes[0]) + calls(nodes[1]); got != 6*keys {
		t.Errorf("%d calls applied in all, want %d", got, 6*keys)
	}
}
