package actors_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// TestTTLEmbedded and TestTTLRedis: keys idle for the pipeline's ttl
// (processing time) leave memory and the store — snapshot, id buckets,
// timer entries — also when they were passivated and the host restarted
// in between; keys that kept receiving events stay; an expired key that
// receives an event again starts fresh.
func TestTTLEmbedded(t *testing.T) {
	// Passivated keys stay resident here and leave memory on Redis: both
	// must expire.
	testTTL(t, openStore(t, t.TempDir()), 0, nil)
}

func TestTTLRedis(t *testing.T) {
	srv := redistest.Start(t)
	store, err := redisstore.Open(srv.URL(), redisstore.Options{Prefix: "ttl"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	testTTL(t, store, -1, func(t *testing.T) []string {
		// Every key left in Redis besides the store's own bookkeeping.
		c := srv.Client()
		defer c.Close()
		keys, err := c.Keys(context.Background(), "ttl*").Result()
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, k := range keys {
			if strings.HasSuffix(k, ":meta") || strings.HasSuffix(k, "}:m") || strings.Contains(k, "}:log") ||
				strings.Contains(k, "\x00clock") {
				continue
			}
			if strings.HasSuffix(k, "}:due") { // a timer index: must hold no expired key
				members, err := c.ZRange(context.Background(), k, 0, -1).Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range members {
					left = append(left, k+" member "+m)
				}
				continue
			}
			left = append(left, k)
		}
		return left
	})
}

func testTTL(t *testing.T, store persistence.Store, maxMemory int64, leftInStore func(t *testing.T) []string) {
	p, err := fold.Compile("p", fold.Spec{
		Key: "k", ID: "id", DedupWindow: time.Hour, TTL: 2 * time.Hour,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	clock.set(winBase)
	cfg := actors.Config{
		Pipelines: map[string]*fold.Pipeline{"p": p}, Now: clock.Now,
		CheckpointInterval: 10 * time.Millisecond, MaxActive: 5, IdleTimeout: time.Hour, MaxMemory: maxMemory,
		WatermarkInterval: 5 * time.Millisecond,
	}
	hs := start(t, store, cfg)
	for i := range 30 {
		hs.ingest(event(fmt.Sprintf("k%d", i), fmt.Sprintf("id%d", i), i))
	}
	eventually(t, "keys passivated", func() bool { return hs.host.Stats().ActiveKeys <= 5 })
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, store, cfg) // the expiry index comes back from the store
	defer hs.shutdown()

	// 90 minutes later the first ten keys get events: they stay.
	clock.set(winBase + 90*60_000)
	for i := range 10 {
		hs.ingest(event(fmt.Sprintf("k%d", i), fmt.Sprintf("again%d", i), i))
	}
	// At 2h01m the other twenty have been idle for the ttl.
	clock.set(winBase + 121*60_000)
	eventually(t, "20 keys expired", func() bool { return hs.host.Stats().Pipelines["p"].Expired == 20 })
	for i := range 30 {
		v, err := hs.host.Query(context.Background(), "p", fmt.Sprintf("k%d", i))
		switch {
		case i < 10 && (err != nil || v.Seq != 2):
			t.Errorf("k%d kept its events: %+v %v", i, v, err)
		case i >= 10 && !errors.Is(err, actors.ErrNotFound):
			t.Errorf("k%d: %+v %v, want expired (not found)", i, v, err)
		}
	}
	// An expired key starts afresh: its old id counts again.
	if r := hs.ingest(event("k15", "id15", 1)); r.Accepted != 1 {
		t.Errorf("expired key's old id: %+v, want it applied", r)
	}
	// The rest expire too; then nothing of them is left in the store.
	clock.set(winBase + 300*60_000)
	eventually(t, "all keys expired", func() bool { return hs.host.Stats().Pipelines["p"].Expired == 31 })
	if leftInStore != nil {
		eventually(t, "the store emptied", func() bool {
			return len(leftInStore(t)) == 0
		})
	}
	eventually(t, "the snapshots deleted", func() bool {
		for i := range 30 {
			key := fmt.Sprintf("k%d", i)
			_, err := store.Get(context.Background(), actors.GroupOf(key, 8), "p\x00"+key)
			if !errors.Is(err, persistence.ErrNotFound) {
				return false
			}
		}
		return true
	})
	for g := range uint32(8) {
		err := store.Timers(context.Background(), g, func(key string, due int64) error {
			return fmt.Errorf("group %d still indexes %q at %d", g, key, due)
		})
		if err != nil {
			t.Error(err)
		}
	}
}
