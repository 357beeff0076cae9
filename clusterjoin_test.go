package keyfold_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
	"github.com/keyfold/keyfold/services/servicetest"
)

// TestClusterJoinAcrossAMove: two nodes on one Redis with an outer interval
// join. Orders and payments go in through one node (forwarded to the
// owners), then the other node leaves, moving its key groups: payments
// sent after the move still match the orders buffered before it, and the
// orders that never get one are emitted alone by the timers of their new
// owner. Every result once, none contradicted.
func TestClusterJoinAcrossAMove(t *testing.T) {
	srv := redistest.Start(t)
	config := func() keyfold.Config {
		cfg := servicetest.Config(t, `
pipelines:
  orders:   {key: k, time: ts, id: id, aggregates: {n: {op: count}}}
  payments: {key: k, time: ts, id: id, aggregates: {n: {op: count}}}
joins:
  paid:
    type: interval
    mode: outer
    left:  {pipeline: orders}
    right: {pipeline: payments}
    lower: 0s
    upper: 1s
    idle_timeout: 500ms
`)
		cfg.Redis, cfg.Cluster, cfg.ClusterLease = srv.URL(), "t", 600*time.Millisecond
		cfg.GRPCAddr = "127.0.0.1:0"
		return cfg
	}
	a := servicetest.Run(t, config())
	b, berr := servicetest.Start(t, config())
	waitStable(t, a, 2)
	ctx := context.Background()
	ingest := func(n *keyfold.Node, pipeline string, evs []json.RawMessage) {
		t.Helper()
		if res, err := n.Ingest(ctx, pipeline, evs); err != nil || res.Accepted != len(evs) {
			t.Fatalf("ingest %s: %+v, %v", pipeline, res, err)
		}
	}
	const t0 = int64(1_800_000_000_000)
	event := func(key, id string, ts int64) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"k":%q,"id":%q,"ts":%d}`, key, id, ts))
	}
	var orders, before, after []json.RawMessage
	want := map[string]bool{}
	for i := range 40 {
		k, ts := fmt.Sprint("k", i), t0+int64(i)
		orders = append(orders, event(k, "o"+k, ts))
		o := &fold.JoinEvent{ID: "o" + k, TimeMs: ts}
		switch {
		case i < 20: // paid before the move
			before = append(before, event(k, "p"+k, ts+500))
			want[fold.JoinOutputID("paid", k, o, &fold.JoinEvent{ID: "p" + k, TimeMs: ts + 500})] = true
		case i < 30: // paid after it
			after = append(after, event(k, "p"+k, ts+900))
			want[fold.JoinOutputID("paid", k, o, &fold.JoinEvent{ID: "p" + k, TimeMs: ts + 900})] = true
		default: // never paid
			want[fold.JoinOutputID("paid", k, o, nil)] = true
		}
	}
	ingest(b, "orders", orders)
	ingest(b, "payments", before)
	movedByB := 0
	for i := range 40 {
		if info, err := a.Cluster(ctx, "paid", fmt.Sprint("k", i)); err == nil && info.Key.Owner == b.GRPCAddr() {
			movedByB++
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-berr; err != nil {
		t.Fatal(err)
	}
	waitStable(t, a, 1)
	ingest(a, "payments", after)

	got := map[string]string{}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < len(want) {
		outs, err := a.Outputs(ctx, "paid", "", 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			if prev, ok := got[o.ID]; ok && prev != string(o.Values) {
				t.Fatalf("result %s stored twice, differently: %s and %s", o.ID, prev, o.Values)
			}
			got[o.ID] = string(o.Values)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d results of %d after 30 s: %v", len(got), len(want), got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for id := range got {
		if !want[id] {
			t.Errorf("unexpected result %s %s", id, got[id])
		}
	}
	t.Logf("%d results; %d of the 40 keys moved from the node that left", len(got), movedByB)
	if movedByB == 0 {
		t.Error("no key of the test lived on the node that left")
	}
}
