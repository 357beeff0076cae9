package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// TestMoveGroupsBetweenHosts: two hosts on one store split the key groups;
// groups move from one to the other and back while events keep coming
// (each sent to the group's current owner, retried on ErrNotOwner); a host
// refuses the groups it does not own; a graceful move leaves the new owner
// next to nothing to replay; at the end a host owning everything holds
// exactly what was acknowledged.
func TestMoveGroupsBetweenHosts(t *testing.T) {
	store := openStore(t, t.TempDir())
	a := start(t, store, actors.Config{Owned: []uint32{0, 1, 2, 3}})
	b := start(t, store, actors.Config{Owned: []uint32{4, 5, 6, 7}})
	owner := func(g uint32) *harness {
		for _, o := range a.host.Owned() {
			if o == g {
				return a
			}
		}
		return b
	}
	rng := rand.New(rand.NewPCG(3, 3))
	sums := map[string]int{}
	send := func(n int) {
		for range n {
			key := fmt.Sprintf("k%d", rng.IntN(60))
			v := rng.IntN(100)
			g := actors.GroupOf(key, 8)
			if _, err := owner(g).host.Ingest(context.Background(), "p", [][]byte{event(key, "", v)}); err != nil {
				t.Fatalf("ingest %s (group %d): %v", key, g, err)
			}
			sums[key] += v
		}
	}
	send(300)
	// The other host refuses them.
	other := a
	if owner(actors.GroupOf("k1", 8)) == a {
		other = b
	}
	if _, err := other.host.Ingest(context.Background(), "p", [][]byte{event("k1", "", 1)}); !errors.Is(err, actors.ErrNotOwner) || !errors.Is(err, actors.ErrUnavailable) {
		t.Fatalf("a host that does not own k1's group: %v, want ErrNotOwner", err)
	}
	for _, move := range [][2][]uint32{
		{{0, 1}, {2, 3, 4, 5, 6, 7}},   // a → 0,1; b takes 2,3
		{{0, 1, 2, 3, 4}, {5, 6, 7}},   // b → a: 2,3,4
		{{}, {0, 1, 2, 3, 4, 5, 6, 7}}, // everything to b
	} {
		// Release first (each keeps only what it keeps), then take over:
		// a graceful move, so the new owners replay nothing.
		for i, h := range []*harness{a, b} {
			var keep []uint32
			for _, g := range h.host.Owned() {
				if slices.Contains(move[i], g) {
					keep = append(keep, g)
				}
			}
			if err := h.host.SetOwned(context.Background(), keep); err != nil {
				t.Fatal(err)
			}
		}
		replayed := a.host.Stats().Replayed + b.host.Stats().Replayed
		for i, h := range []*harness{a, b} {
			if err := h.host.SetOwned(context.Background(), move[i]); err != nil {
				t.Fatal(err)
			}
		}
		if r := a.host.Stats().Replayed + b.host.Stats().Replayed - replayed; r > 0 {
			t.Errorf("%d records replayed taking over groups released (checkpointed) before", r)
		}
		send(200)
	}
	if err := a.shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := b.shutdown(); err != nil {
		t.Fatal(err)
	}
	all := start(t, store, actors.Config{})
	defer all.shutdown()
	for key, sum := range sums {
		if v := all.query(key); v.Aggregates["sum"] != float64(sum) {
			t.Errorf("%s: sum %v, want %d", key, v.Aggregates["sum"], sum)
		}
	}
}

// keyOfGroup returns a key of pipeline p in group g (of 8).
func keyOfGroup(g uint32) string {
	for i := 0; ; i++ {
		if k := fmt.Sprint("k", i); actors.GroupOf(k, 8) == g {
			return k
		}
	}
}

// A SetOwned whose context ends while the store refuses claims leaves its
// groups to the take-over loop, which serves them once the store is back.
func TestSetOwnedRetriedAfterTimeout(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{Owned: []uint32{0, 1, 2, 3}})
	defer hs.shutdown()
	fs.InjectAll(faultstore.OpClaim, faultstore.Fault{Err: errors.New("down")})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := hs.host.SetOwned(ctx, []uint32{0, 1, 2, 3, 4, 5, 6, 7})
	cancel()
	if err == nil {
		t.Fatal("SetOwned succeeded with claims failing")
	}
	fs.Reset()
	key := keyOfGroup(5)
	eventually(t, "group 5 served", func() bool {
		_, err := hs.host.Ingest(context.Background(), "p", [][]byte{event(key, "", 1)})
		return err == nil
	})
}

// A group released while the take-over loop is claiming it is not served
// afterwards (the take-over notices the release and drops it).
func TestReleaseDuringTakeOver(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{})
	defer hs.shutdown()
	key := keyOfGroup(5)
	hs.ingest(event(key, "", 1))
	claims := fs.Calls(faultstore.OpClaim)
	fs.DelayNext(faultstore.OpClaim, 300*time.Millisecond)
	fs.FailNext(faultstore.OpAppend, errors.New("boom")) // loses group 5
	if _, err := hs.host.Ingest(context.Background(), "p", [][]byte{event(key, "", 1)}); err == nil {
		t.Fatal("ingest succeeded with its append failing")
	}
	eventually(t, "the take-over claiming", func() bool { return fs.Calls(faultstore.OpClaim) > claims })
	if err := hs.host.SetOwned(context.Background(), []uint32{0, 1, 2, 3, 4, 6, 7}); err != nil {
		t.Fatal(err)
	}
	// Once the delayed take-over is over, the group must still be out.
	eventually(t, "the take-over over", func() bool { return hs.host.Stats().GroupsTakingOver == 0 })
	if v, err := hs.host.Query(context.Background(), "p", key); err == nil {
		t.Fatalf("a released group is served: %+v", v)
	}
	if st := hs.host.Stats(); st.GroupsUnavailable != 0 {
		t.Errorf("%d owned groups unavailable", st.GroupsUnavailable)
	}
}

// keyIn returns a key of pipeline p in group g (of 8).
func keyIn(t *testing.T, g uint32) string {
	t.Helper()
	for i := range 10_000 {
		if k := fmt.Sprintf("key%d", i); actors.GroupOf(k, 8) == g {
			return k
		}
	}
	t.Fatalf("no key in group %d", g)
	return ""
}

// TestRefusedWhole: a batch with a key of a group the host does not serve
// is refused whole (ErrNotServed), nothing of it logged, whether the host
// stopped serving the group before the batch was submitted or after it
// was queued (while the previous commit was writing). A cluster node routes
// such a batch again, which would double the part logged otherwise.
func TestRefusedWhole(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	hs := start(t, fs, actors.Config{Owned: []uint32{1, 2, 3}})
	k1, k2, k5 := keyIn(t, 1), keyIn(t, 2), keyIn(t, 5)
	query := func(key string) error {
		_, err := hs.host.Query(context.Background(), "p", key)
		return err
	}

	_, err := hs.host.Ingest(context.Background(), "p", [][]byte{event(k1, "", 1), event(k5, "", 1)})
	if !errors.Is(err, actors.ErrNotServed) || !errors.Is(err, actors.ErrNotOwner) || !errors.Is(err, actors.ErrUnavailable) {
		t.Fatalf("batch with a key of an unowned group: %v, want ErrNotServed, ErrNotOwner, ErrUnavailable", err)
	}
	if err := query(k1); !errors.Is(err, actors.ErrNotFound) {
		t.Fatalf("%s after a refused batch: %v, want ErrNotFound (nothing logged)", k1, err)
	}

	// A commit holds the commit loop in the store; a batch of groups 1 and 2
	// waits in the queue; group 2 is released meanwhile.
	fs.DelayNext(faultstore.OpAppend, 300*time.Millisecond)
	first, err := hs.host.Submit(context.Background(), "p", [][]byte{event(k2, "", 1)})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first commit to reach the store", func() bool { return fs.Calls(faultstore.OpAppend) >= 1 })
	second, err := hs.host.Submit(context.Background(), "p", [][]byte{event(k1, "", 7), event(k2, "", 7)})
	if err != nil {
		t.Fatalf("submit while group 2 is served: %v", err)
	}
	released := make(chan error, 1)
	go func() { released <- hs.host.SetOwned(context.Background(), []uint32{1, 3}) }()
	eventually(t, "group 2 to be released", func() bool { return !slices.Contains(hs.host.Owned(), 2) })
	if _, err := first.Wait(context.Background()); err != nil {
		t.Fatalf("the batch committed before the release: %v", err)
	}
	if _, err := second.Wait(context.Background()); !errors.Is(err, actors.ErrNotServed) {
		t.Fatalf("a queued batch of a group released meanwhile: %v, want ErrNotServed", err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err := query(k1); !errors.Is(err, actors.ErrNotFound) {
		t.Fatalf("%s after its batch was refused: %v, want ErrNotFound (nothing logged)", k1, err)
	}
}

// TestAbandon: a host whose memory may be stale (its node's lease lapsed
// while another host took a group over and wrote to it) abandons every
// group: it answers nothing from memory, writes nothing (no checkpoint of
// its stale keys), and a group given back to it is taken over anew, from
// the log, with everything the other host acknowledged.
func TestAbandon(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	a := start(t, fs, actors.Config{CheckpointInterval: time.Hour})
	key := keyIn(t, 5)
	a.ingest(event(key, "", 5))
	if v := a.query(key); v.Aggregates["sum"] != float64(5) {
		t.Fatalf("%s on a: %v, want sum 5", key, v.Aggregates)
	}
	// b takes group 5 over (claims it, fencing a) and writes to it; a does
	// not know and still holds the key in memory.
	b := start(t, fs, actors.Config{Owned: []uint32{5}, CheckpointInterval: time.Hour})
	b.ingest(event(key, "", 7))
	if v := a.query(key); v.Aggregates["sum"] != float64(5) {
		t.Fatalf("a's memory of %s: %v, want the stale sum 5 (the premise of the test)", key, v.Aggregates)
	}

	checkpoints := fs.Calls(faultstore.OpCheckpoint)
	reason := errors.New("lease lapsed")
	if got := a.host.Abandon(reason); len(got) != 8 {
		t.Fatalf("Abandon returned %v, want the 8 groups", got)
	}
	if n := fs.Calls(faultstore.OpCheckpoint) - checkpoints; n != 0 {
		t.Errorf("Abandon wrote %d checkpoints, want none", n)
	}
	if owned := a.host.Owned(); len(owned) != 0 {
		t.Errorf("owned after Abandon: %v", owned)
	}
	if st := a.host.Stats(); st.ActiveKeys != 0 {
		t.Errorf("%d keys in memory after Abandon", st.ActiveKeys)
	}
	if v, err := a.host.Query(context.Background(), "p", key); !errors.Is(err, actors.ErrNotOwner) || !errors.Is(err, actors.ErrUnavailable) {
		t.Fatalf("query after Abandon: %+v %v, want ErrNotOwner and ErrUnavailable", v, err)
	}
	if _, err := a.host.Ingest(context.Background(), "p", [][]byte{event(keyIn(t, 1), "", 1)}); !errors.Is(err, actors.ErrNotServed) {
		t.Fatalf("ingest after Abandon: %v, want ErrNotServed", err)
	}
	if got := a.host.Abandon(reason); got != nil {
		t.Errorf("Abandon of a host serving nothing returned %v", got)
	}

	// b hands group 5 back; a takes every group over again.
	if err := b.shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := a.host.SetOwned(context.Background(), []uint32{0, 1, 2, 3, 4, 5, 6, 7}); err != nil {
		t.Fatal(err)
	}
	if v := a.query(key); v.Aggregates["sum"] != float64(12) {
		t.Fatalf("%s after a took it over again: %v, want sum 12", key, v.Aggregates)
	}
	if err := a.shutdown(); err != nil {
		t.Fatal(err)
	}
}

// levelCounter counts log records by level and message.
type levelCounter struct {
	mu sync.Mutex
	n  map[string]int // "LEVEL message"
}

func (c *levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *levelCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[r.Level.String()+" "+r.Message]++
	return nil
}
func (c *levelCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *levelCounter) WithGroup(string) slog.Handler      { return c }
func (c *levelCounter) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// A group whose next owner claims it while this host is still releasing
// it (a start, a rebalance) is expected to be fenced: that is logged at
// INFO. A group this host is still to serve that another writer takes is a
// warning.
func TestFencedReleaseIsNotAWarning(t *testing.T) {
	fs := faultstore.New(openStore(t, t.TempDir()))
	logs := &levelCounter{n: map[string]int{}}
	a := start(t, fs, actors.Config{Logger: slog.New(logs)})
	defer a.shutdown()
	key := "k1"
	g := actors.GroupOf(key, 8)
	a.ingest(event(key, "1", 1))

	// The release's checkpoint is slow; the next owner claims meanwhile.
	fs.DelayNext(faultstore.OpCheckpoint, 300*time.Millisecond)
	var keep []uint32
	for x := range uint32(8) {
		if x != g {
			keep = append(keep, x)
		}
	}
	released := make(chan error, 1)
	go func() { released <- a.host.SetOwned(context.Background(), keep) }()
	eventually(t, "the release to start", func() bool { return !slices.Contains(a.host.Owned(), g) })
	b := start(t, fs.Inner(), actors.Config{Owned: []uint32{g}})
	defer b.shutdown()
	if err := <-released; err != nil {
		t.Logf("release: %v", err) // fenced: the next owner has it
	}
	if n := logs.count("WARN key groups lost; taking them over again"); n != 0 {
		t.Errorf("%d warnings for a group fenced while it was released, want 0 (%v)", n, logs.n)
	}
	if v := b.query(key); v.Seq != 1 {
		t.Errorf("%s on its next owner: %+v", key, v)
	}

	// A group still to be served here, taken by another writer: a warning.
	other := uint32((g + 1) % 8)
	c := start(t, fs.Inner(), actors.Config{Owned: []uint32{other}})
	defer c.shutdown()
	var k2 string
	for i := 0; ; i++ {
		if k2 = fmt.Sprintf("x%d", i); actors.GroupOf(k2, 8) == other {
			break
		}
	}
	a.host.Ingest(context.Background(), "p", [][]byte{event(k2, "1", 1)}) // fenced
	eventually(t, "the warning", func() bool { return logs.count("WARN key groups lost; taking them over again") > 0 })
}
