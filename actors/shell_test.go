package actors_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
)

// An actor whose key passivates runs another key next (shell.go): under
// constant churn (five active keys, two hundred in use from two writers at
// once) most activations reuse an actor, and every key still applies its
// own events and no other key's, exactly once.
func TestActorsAreReusedAcrossActivations(t *testing.T) {
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 4, MaxActive: 5, IdleTimeout: time.Hour, CheckpointInterval: 5 * time.Millisecond})
	defer hs.shutdown()
	const keys, rounds, batch = 200, 6, 20
	var wg sync.WaitGroup
	for w := range 2 { // writer w sends the keys of its parity
		wg.Go(func() {
			for r := range rounds {
				var raws [][]byte
				for i := w; i < keys; i += 2 {
					raws = append(raws, event(fmt.Sprintf("k%d", i), fmt.Sprintf("r%d", r), i*10+r))
					if len(raws) == batch {
						hs.ingest(raws...)
						raws = nil
					}
				}
				if len(raws) > 0 {
					hs.ingest(raws...)
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
	if st.Spawned > st.Activations/4 {
		t.Errorf("%d actors spawned for %d activations: want most activations to reuse an idle actor", st.Spawned, st.Activations)
	}
}
