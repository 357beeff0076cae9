package actors_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
			g := actors.GroupOf("p", key, 8)
			if _, err := owner(g).host.Ingest(context.Background(), "p", [][]byte{event(key, "", v)}); err != nil {
				t.Fatalf("ingest %s (group %d): %v", key, g, err)
			}
			sums[key] += v
		}
	}
	send(300)
	// The other host refuses them.
	other := a
	if owner(actors.GroupOf("p", "k1", 8)) == a {
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
		if k := fmt.Sprint("k", i); actors.GroupOf("p", k, 8) == g {
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
