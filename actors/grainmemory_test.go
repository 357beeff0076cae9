package actors_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

// A grain keeps its key's bytes in itself (a short key), and what keeps
// the key after the grain left memory copies it: here the index of when
// keys expire, which an event of a pipeline with a ttl sets. Kept by its
// key's string, a grain would stay in memory, state and all, until its
// key expired.
func TestGrainThatLeftMemoryIsNotKept(t *testing.T) {
	p, err := fold.Compile("p", fold.Spec{Key: "k", TTL: time.Hour, Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Pipelines: map[string]*fold.Pipeline{"p": p}, Groups: 1, MaxActive: 1,
		MaxMemory: -1, IdleTimeout: time.Hour, CheckpointInterval: time.Hour})
	defer hs.shutdown()
	hs.ingest(event("a", "", 1))
	collected := actors.WatchGrain(hs.host, "p", "a")
	if collected == nil {
		t.Fatal("key a is not in memory after its event")
	}
	hs.ingest(event("b", "", 1)) // a is passivated, changed
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "key a to leave memory once stored", func() bool { return !actors.InMemory(hs.host, "p", "a") })
	eventually(t, "key a's grain to be collected", collected)
	if v, err := hs.host.Query(context.Background(), "p", "a"); err != nil || fmt.Sprint(v.Aggregates["n"]) != "1" {
		t.Fatalf("key a after it left memory: %+v, %v", v.Aggregates, err)
	}
}

// The order of use is kept lazily (Host.passivate): a key used while
// active is marked, and passivation moves a marked key up instead of
// taking it, a batch of keys per hold of the host's lock. With every
// active key used again, a new key beyond MaxActive is still passivated
// down to MaxActive (the walk ends, over several batches too), and the
// key used last stays.
func TestPassivationWhenEveryKeyWasUsed(t *testing.T) {
	for _, n := range []int{3, 600} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 1, MaxActive: n, IdleTimeout: time.Hour, CheckpointInterval: time.Hour})
			defer hs.shutdown()
			for range 2 {
				for i := range n {
					hs.ingest(event(fmt.Sprint("k", i), "", 1))
				}
			}
			hs.ingest(event("new", "", 1))
			// (A key passivated is resident once its actor has stopped,
			// a moment after it left the active keys.)
			eventually(t, "MaxActive active keys and the one passivated resident", func() bool {
				st := hs.host.Stats()
				return st.ActiveKeys == n && st.ResidentKeys == 1
			})
			if last := fmt.Sprint("k", n-1); !actors.Active(hs.host, "p", last) {
				t.Errorf("key %s, used last before the new one, was passivated", last)
			}
		})
	}
}

// A key used again and again stays active; one not used since it became
// active is passivated once idle, though it was used after the first
// (which the walk moves up when it meets it marked).
func TestIdleKeyBehindAUsedOne(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 1, MaxActive: 10, IdleTimeout: 200 * time.Millisecond, CheckpointInterval: 20 * time.Millisecond})
	defer hs.shutdown()
	hs.ingest(event("busy", "", 1))
	hs.ingest(event("idle", "", 1))
	// (The busy key is used at each poll: every 5 ms.)
	if !pollUntil(10*time.Second, func() bool {
		hs.ingest(event("busy", "", 1))
		return !actors.Active(hs.host, "p", "idle")
	}) {
		t.Fatal("the idle key is still active after 10 s")
	}
	if !actors.Active(hs.host, "p", "busy") {
		t.Error("the busy key was passivated")
	}
}
