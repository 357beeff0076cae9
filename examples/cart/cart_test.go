package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
)

// startCarts runs the cart service's node in-process on a temp dir.
func startCarts(t *testing.T, abandonAfter time.Duration) *keyfold.Node {
	t.Helper()
	cfg, err := config(t.TempDir(), "", "", abandonAfter)
	if err != nil {
		t.Fatal(err)
	}
	node, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- node.Run(context.Background()) }()
	<-node.Ready()
	t.Cleanup(func() {
		node.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return node
}

// TestCart walks a cart through its calls and events: adds, a failing
// remove (the cart unchanged), a read-only get, product views, a checkout
// that emits the order and empties the cart, and its retry, answered with
// the first reply.
func TestCart(t *testing.T) {
	node := startCarts(t, time.Hour)
	ctx := context.Background()
	call := func(req, id string, readOnly bool) (keyfold.CallResult, error) {
		return node.Call(ctx, "carts", "alice", json.RawMessage(req), keyfold.CallOptions{ID: id, ReadOnly: readOnly})
	}
	for _, c := range []struct{ req, id, want string }{
		{`{"op":"add","item":"apple","qty":2,"price":40}`, "r1", `{"items":{"apple":{"qty":2,"price":40}},"total":80}`},
		{`{"op":"add","item":"pear","qty":1,"price":55}`, "r2", `{"items":{"apple":{"qty":2,"price":40},"pear":{"qty":1,"price":55}},"total":135}`},
		{`{"op":"add","item":"pear","qty":1,"price":55}`, "r2", `{"items":{"apple":{"qty":2,"price":40},"pear":{"qty":1,"price":55}},"total":135}`}, // a retry
		{`{"op":"remove","item":"apple"}`, "r3", `{"items":{"pear":{"qty":1,"price":55}},"total":55}`},
	} {
		r, err := call(c.req, c.id, false)
		if err != nil || string(r.Reply) != c.want {
			t.Fatalf("%s (%s): %s %v, want %s", c.req, c.id, r.Reply, err, c.want)
		}
	}
	if _, err := call(`{"op":"remove","item":"plum"}`, "r4", false); !errors.Is(err, keyfold.ErrCallFailed) {
		t.Fatalf("removing what is not there: %v", err)
	}
	if _, err := node.Ingest(ctx, "carts", []json.RawMessage{
		json.RawMessage(`{"user":"alice","event_id":"v1","type":"viewed"}`),
		json.RawMessage(`{"user":"alice","event_id":"v1","type":"viewed"}`),
		json.RawMessage(`{"user":"alice","event_id":"v2","type":"viewed"}`),
	}); err != nil {
		t.Fatal(err)
	}
	st, err := node.Query(ctx, "carts", "alice")
	if err != nil || string(st.State) != `{"items":{"pear":{"qty":1,"price":55}},"views":2}` {
		t.Fatalf("alice: %s %v", st.State, err)
	}
	for i := range 2 {
		r, err := call(`{"op":"checkout"}`, "r5", false)
		if err != nil || string(r.Reply) != `{"items":1,"total":55}` || r.Duplicate != (i == 1) {
			t.Fatalf("checkout %d: %s %v %v", i, r.Reply, r.Duplicate, err)
		}
	}
	r, err := call(`{"op":"get"}`, "", true)
	if err != nil || string(r.Reply) != `{"items":{},"total":0}` {
		t.Fatalf("after the checkout: %s %v", r.Reply, err)
	}
	outs := waitOutputs(t, node, 1)
	if outs[0].Name != "order" || string(outs[0].Values) != `{"items":1,"total":55}` {
		t.Fatalf("output %+v %s", outs[0], outs[0].Values)
	}
}

// TestCartAbandoned: a cart left alone is abandoned by its processing-time
// timer, with no further input.
func TestCartAbandoned(t *testing.T) {
	node := startCarts(t, 300*time.Millisecond)
	ctx := context.Background()
	if _, err := node.Call(ctx, "carts", "bob", json.RawMessage(`{"op":"add","item":"fig","qty":3,"price":10}`), keyfold.CallOptions{ID: "b1"}); err != nil {
		t.Fatal(err)
	}
	outs := waitOutputs(t, node, 1)
	if outs[0].Name != "abandoned" || string(outs[0].Values) != `{"items":3,"total":30}` {
		t.Fatalf("output %+v %s", outs[0], outs[0].Values)
	}
	if _, err := node.Query(ctx, "carts", "bob"); !errors.Is(err, keyfold.ErrNotFound) {
		t.Fatalf("bob after the abandon: %v, want not found", err)
	}
}

// waitOutputs polls until the carts pipeline has stored n outputs.
func waitOutputs(t *testing.T, node *keyfold.Node, n int) []keyfold.Output {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		outs, err := node.Outputs(context.Background(), "carts", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) >= n {
			return outs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d outputs after 10 s, want %d", len(outs), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
