package fold

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// list returns the ids, oldest first, as strings.
func (d *idSet) list() []seenID {
	out := make([]seenID, 0, d.n)
	for c := d.cursor(); c.more(); {
		id, at := c.next()
		out = append(out, seenID{string(id), at})
	}
	return out
}

// The id set against a model (a slice in order of addition): ids come and
// go through every size — searched in the log, indexed, reindexed as the
// index fills with expired slots, compacted, emptied — with times mostly
// increasing, sometimes equal or earlier, and some ids long; in odd seeds
// the log outgrows the index's narrow slots.
func TestIDSetAgainstModel(t *testing.T) {
	defer func(l int) { narrowLimit = l }(narrowLimit)
	for seed := range uint64(40) {
		narrowLimit = 1<<24 - 1
		if seed%2 == 1 {
			narrowLimit = 3000
		}
		r := rand.New(rand.NewPCG(seed, 7))
		var d idSet
		var model []seenID
		const width = 1000
		now := int64(1_700_000_000_000)
		next, most, compactions, prevHead, sawWide := 0, 0, 0, int32(0), false
		for step := range 4000 {
			switch op := r.IntN(100); {
			case op < 70: // a new id (or, sometimes, one it holds)
				var id string
				if len(model) > 0 && r.IntN(4) == 0 {
					id = model[r.IntN(len(model))].id
				} else {
					id = fmt.Sprintf("id-%d-%s", next, string(make([]byte, r.IntN(3)*r.IntN(200))))
					next++
				}
				want := slices.ContainsFunc(model, func(e seenID) bool { return e.id == id })
				if got := d.has(id); got != want {
					t.Fatalf("seed %d step %d: has(%q) = %v, want %v", seed, step, id, got, want)
				}
				if want {
					continue
				}
				at := now
				switch r.IntN(10) {
				case 0:
					at -= int64(r.IntN(5000)) // out of order
				case 1, 2:
					now += int64(r.IntN(10_000))
					at = now
				}
				d.add(id, at, width)
				model = append(model, seenID{id, at})
			case op < 80: // expire: the front of the model up to the first id still within
				horizon := now - int64(r.IntN(300_000))
				d.expire(horizon, width, uint64(step))
				n := 0
				for n < len(model) && model[n].at <= horizon {
					n++
				}
				model = model[n:]
			case op < 81: // a long silence: everything goes
				now += 1_000_000
				d.expire(now, width, uint64(step))
				model = nil
			default: // an id never added
				if d.has(fmt.Sprintf("absent-%d", step)) {
					t.Fatalf("seed %d step %d: has an id never added", seed, step)
				}
			}
			most = max(most, len(model))
			sawWide = sawWide || d.index != nil && d.index.wide
			if prevHead > 0 && d.head == 0 && d.n > 0 {
				compactions++
			}
			prevHead = d.head
			if d.len() != len(model) {
				t.Fatalf("seed %d step %d: %d ids, want %d", seed, step, d.len(), len(model))
			}
			if step%97 == 0 {
				if got := d.list(); !slices.Equal(got, model) && (len(got) != 0 || len(model) != 0) {
					t.Fatalf("seed %d step %d: ids %v, want %v", seed, step, got, model)
				}
				for _, e := range model {
					if !d.has(e.id) {
						t.Fatalf("seed %d step %d: lost %q", seed, step, e.id)
					}
				}
				if len(model) > int(scanIDs) && d.index == nil {
					t.Fatalf("seed %d step %d: %d ids and no index", seed, step, len(model))
				}
			}
		}
		if most < 50 || compactions == 0 || sawWide != (seed%2 == 1) {
			t.Fatalf("seed %d: at most %d ids at once, %d compactions, wide slots %v: the test did not reach what it is for", seed, most, compactions, sawWide)
		}
	}
}

// A remembered id costs at most 32 B of memory, its bytes included, for
// ids of the length of bench's, whether the set is small or large and
// while ids expire (measured from the heap; memSize, what max_memory is
// charged, is checked against the same figure).
func TestIDMemory(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector's allocations are not the release build's")
	}
	const keys = 20_000
	for _, perKey := range []int{1, 4, 8, 40, 400} {
		t.Run(fmt.Sprintf("ids=%d", perKey), func(t *testing.T) {
			sets := make([]idSet, keys*10/perKey/10+1)
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			n, est := 0, 0
			for i := range sets {
				for j := range perKey {
					// "e" and a number, as keyfold bench's ids: 8–9 bytes
					sets[i].add(fmt.Sprintf("e%08d", n), int64(1_700_000_000_000+j*1500), 5_400_000)
					n++
				}
				// some expire, as they would under load
				sets[i].expire(int64(1_700_000_000_000+(perKey/4)*1500-1), 5_400_000, 1)
			}
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			held := 0
			for i := range sets {
				held += sets[i].len()
				est += sets[i].memSize()
			}
			perID := float64(after.HeapAlloc-before.HeapAlloc) / float64(held)
			t.Logf("%d ids per key: %.1f B per id held (estimate %.1f)", perKey, perID, float64(est)/float64(held))
			if perID > 32 {
				t.Errorf("%.1f B per id held, want at most 32", perID)
			}
			if e := float64(est) / float64(held); e < perID*0.7 {
				t.Errorf("memSize says %.1f B per id, the heap %.1f", e, perID)
			}
			runtime.KeepAlive(sets)
		})
	}
}
