package actors_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// An actor whose key passivates runs another key next (shell.go): under
// constant churn (five active keys, two hundred in use from two writers at
// once) most activations reuse an actor, and every key still applies its
// own events and no other key's, exactly once. Also with a pool of two idle
// actors (the others are stopped), and with appends failing now and then:
// each failure loses the groups of its commit, whose active keys' actors
// are handed back without parking them, and the writers retry (the events
// carry ids). Keys passivate both ways (stopLocked): at once when their
// actor is idle, and by a message when it still has inputs to apply.
func TestActorsAreReusedAcrossActivations(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxIdle  int // 0: the default
		failures int // appends that fail, spread over the run
	}{
		{name: "pool"},
		{name: "pool of 2", maxIdle: 2},
		{name: "groups lost", failures: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := faultstore.New(openStore(t, t.TempDir()))
			hs := start(t, fs, actors.Config{Groups: 4, MaxActive: 5, IdleTimeout: time.Hour, CheckpointInterval: 5 * time.Millisecond})
			defer hs.shutdown()
			if tc.maxIdle > 0 {
				actors.SetMaxIdleActors(hs.host, tc.maxIdle)
			}
			for i := range tc.failures {
				fs.FailNth(faultstore.OpAppend, 8+7*i, errors.New("injected"))
			}
			const keys, rounds, batch = 200, 6, 20
			var (
				wg     sync.WaitGroup
				failed sync.Map // writer -> ingests that failed (and were retried)
			)
			send := func(w int, raws [][]byte) {
				for tries := 0; ; tries++ {
					_, err := hs.host.Ingest(context.Background(), "p", raws)
					if err == nil {
						return
					}
					if tries == 0 {
						n, _ := failed.LoadOrStore(w, new(int))
						*n.(*int)++
					}
					if tries == 200 {
						t.Errorf("writer %d: ingest still failing: %v", w, err)
						return
					}
					// Retried once the lost groups are served again.
					pollUntil(5*time.Second, func() bool { return hs.host.Stats().GroupsUnavailable == 0 })
				}
			}
			for w := range 2 { // writer w sends the keys of its parity
				wg.Go(func() {
					for r := range rounds {
						var raws [][]byte
						for i := w; i < keys; i += 2 {
							raws = append(raws, event(fmt.Sprintf("k%d", i), fmt.Sprintf("r%d", r), i*10+r))
							if len(raws) == batch {
								send(w, raws)
								raws = nil
							}
						}
						if len(raws) > 0 {
							send(w, raws)
						}
					}
				})
			}
			wg.Wait()
			for i := range keys {
				want := float64(rounds*i*10 + rounds*(rounds-1)/2)
				if v := hs.query(fmt.Sprintf("k%d", i)); v.Seq != rounds || v.Aggregates["sum"] != want || fmt.Sprintf("%s", v.Aggregates["last"]) != fmt.Sprint(i*10+rounds-1) {
					t.Fatalf("k%d = seq %d, %s; want %d events of sum %v, the last %d", i, v.Seq, v.Aggregates, rounds, want, i*10+rounds-1)
				}
			}
			st := hs.host.Stats()
			if st.Activations < keys*rounds/2 {
				t.Fatalf("%d activations for %d keys × %d rounds with 5 active: the test did not churn", st.Activations, keys, rounds)
			}
			switch {
			case tc.maxIdle > 0:
				if st.IdleActors > tc.maxIdle {
					t.Errorf("%d idle actors, at most %d wanted", st.IdleActors, tc.maxIdle)
				}
			case st.Spawned > st.Activations/4:
				t.Errorf("%d actors spawned for %d activations: want most activations to reuse an idle actor", st.Spawned, st.Activations)
			}
			// Both ways of passivating ran: at once for a key whose actor
			// was idle, by a message for one whose actor still had its
			// inputs to apply (keys activated by the commit that pushed
			// them out of the five).
			if atOnce, byMessage := actors.PassivatedBy(hs.host); atOnce == 0 || byMessage == 0 {
				t.Errorf("passivated %d keys at once, %d by a message to their actor: want both", atOnce, byMessage)
			}
			if tc.failures > 0 {
				n := 0
				failed.Range(func(_, v any) bool { n += *v.(*int); return true })
				if n == 0 || st.GroupsLost == 0 {
					t.Errorf("%d failed ingests, %d groups lost: the injected append failures did not happen", n, st.GroupsLost)
				}
			}
		})
	}
}

// A key remembering more ids than one part of an id bucket holds (fold's
// PartIDs) is checkpointed part by part, and its ids all come back
// from the store after a restart: every one is a duplicate there.
func TestIDBucketPartsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := actors.Config{Groups: 4, CheckpointInterval: 5 * time.Millisecond}
	hs := start(t, openStore(t, dir), cfg)
	const ids = 1000
	for i := 0; i < ids; i += 50 {
		var raws [][]byte
		for j := i; j < i+50; j++ {
			raws = append(raws, event("hot", fmt.Sprintf("id%d", j), 1))
		}
		hs.ingest(raws...)
		// A checkpoint in between: each writes the parts that changed.
		eventually(t, "the key checkpointed", func() bool { return hs.host.Stats().DirtyKeys == 0 })
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs.store.Close()
	hs = start(t, openStore(t, dir), cfg)
	defer hs.shutdown()
	var raws [][]byte
	for j := range ids {
		raws = append(raws, event("hot", fmt.Sprintf("id%d", j), 1))
	}
	if r := hs.ingest(raws...); r.Duplicates != ids {
		t.Fatalf("after a restart %+v: want all %d ids remembered", r, ids)
	}
	if r := hs.ingest(event("hot", "new", 1)); r.Accepted != 1 {
		t.Fatalf("a new id: %+v", r)
	}
	if v := hs.query("hot"); v.Seq != ids+1 {
		t.Fatalf("hot = seq %d, want %d", v.Seq, ids+1)
	}
}
