package embedded

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// TestOutputsVisibleInOrder: a checkpoint that took a pipeline's earlier
// sequence numbers and has not committed yet holds back the readers of the
// pipeline, also from the later outputs of a checkpoint that did commit; a
// reader that saw the later ones first would resume after them and never
// see the earlier ones. A trim leaves both alone meanwhile.
func TestOutputsVisibleInOrder(t *testing.T) {
	ctx := t.Context()
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var epochs [3]persistence.Epoch
	for g := uint32(1); g <= 2; g++ {
		st, err := s.Claim(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		epochs[g] = st.Epoch
	}
	held, release := make(chan struct{}), make(chan struct{})
	s.testHookCommit = func(g uint32) {
		if g == 1 {
			close(held)
			<-release
		}
	}
	checkpoint := func(g uint32, data string) error {
		return s.Checkpoint(ctx, g, epochs[g], persistence.CheckpointData{
			Outputs: []persistence.Output{{Pipeline: "p", Data: []byte(data)}},
		})
	}
	read := func() []string {
		t.Helper()
		got, err := s.ReadOutputs(ctx, "p", "", 10)
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, o := range got {
			ds = append(ds, string(o.Data))
		}
		return ds
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := checkpoint(1, "first"); err != nil {
			t.Error(err)
		}
	})
	<-held // group 1 took sequence number 1 and waits to commit
	if err := checkpoint(2, "second"); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got) != 0 {
		t.Errorf("ReadOutputs while the first output is not committed = %q, want none", got)
	}
	if n, err := s.TrimOutputs(ctx, "p", time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("TrimOutputs while the first output is not committed = %d, %v; want 0", n, err)
	}
	close(release)
	wg.Wait()
	if got := read(); len(got) != 2 || got[0] != "first" || got[1] != "second" {
		t.Errorf("ReadOutputs after both commits = %q, want [first second]", got)
	}
}

// TestConcurrentOutputsDelayedCommits: 16 groups checkpoint outputs to one
// pipeline at once (as many as the host runs), each commit delayed by up to
// a millisecond after its outputs took their sequence numbers, so that
// commits land out of sequence order, while a reader pages through the
// pipeline, resuming from the last cursor it got. It must see every output
// exactly once, each group's in order.
func TestConcurrentOutputsDelayedCommits(t *testing.T) {
	const groups, rounds, perRound = 16, 10, 2
	ctx := t.Context()
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.testHookCommit = func(uint32) {
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
	}
	done := make(chan struct{})
	var seen []string
	var reader, writers sync.WaitGroup
	reader.Go(func() {
		after := ""
		for last := false; ; {
			select {
			case <-done:
				last = true // the writers are over: read to the end
			default:
			}
			page, err := s.ReadOutputs(ctx, "p", after, 3)
			if err != nil {
				t.Error(err)
				return
			}
			if len(page) == 0 && last {
				return
			}
			for _, o := range page {
				seen = append(seen, string(o.Data))
				after = o.Cursor
			}
		}
	})
	for g := range uint32(groups) {
		writers.Go(func() {
			st, err := s.Claim(ctx, g)
			if err != nil {
				t.Error(err)
				return
			}
			for r := range rounds {
				var outs []persistence.Output
				for i := range perRound {
					outs = append(outs, persistence.Output{Pipeline: "p", Data: fmt.Appendf(nil, "%d/%d", g, r*perRound+i)})
				}
				if err := s.Checkpoint(ctx, g, st.Epoch, persistence.CheckpointData{Outputs: outs}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(done)
	reader.Wait()

	next := make([]int, groups)
	for _, d := range seen {
		var g, i int
		if _, err := fmt.Sscanf(d, "%d/%d", &g, &i); err != nil {
			t.Fatalf("unexpected output %q", d)
		}
		if i != next[g] {
			t.Fatalf("the reader saw output %q, want %d/%d next: it skipped one or saw one twice", d, g, next[g])
		}
		next[g]++
	}
	if len(seen) != groups*rounds*perRound {
		t.Errorf("the reader saw %d outputs, want %d", len(seen), groups*rounds*perRound)
	}
}
