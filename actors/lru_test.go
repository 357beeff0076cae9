package actors

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Two lists sharing one table against slices kept in the same order, over
// random pushes, uses, moves from one list to the other (out and in, or
// moveTo, which keeps the grain's handle) and removals: each
// list's order both ways, its count, and the table holding exactly the
// listed grains at their handles (a removed grain gives its handle back,
// and the table does not keep it).
func TestLRUOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var table grainTable
	lists := [2]lru{{t: &table}, {t: &table}}
	var want [2][]*grain // most recent first
	in := map[*grain]int{}
	var all []*grain // those in a list
	for i := range 20000 {
		switch k := rng.IntN(40); {
		case rng.IntN(3) == 0 || len(all) == 0: // a new grain joins a list
			a, l := &grain{group: uint32(i)}, rng.IntN(2)
			lists[l].pushFront(a)
			want[l] = slices.Insert(want[l], 0, a)
			in[a] = l
			all = append(all, a)
		default:
			at := rng.IntN(len(all))
			a := all[at]
			l := in[a]
			j := slices.Index(want[l], a)
			switch {
			case k < 15: // use
				lists[l].touch(a)
				want[l] = slices.Insert(slices.Delete(want[l], j, j+1), 0, a)
			case k < 25: // to the other list, out and in or moved (keeping its handle)
				if was := a.slot; k < 20 {
					lists[l].remove(a)
					lists[1-l].pushFront(a)
				} else {
					lists[l].moveTo(&lists[1-l], a)
					if a.slot != was {
						t.Fatalf("step %d: a grain moved from handle %d to %d", i, was, a.slot)
					}
				}
				want[l] = slices.Delete(want[l], j, j+1)
				want[1-l] = slices.Insert(want[1-l], 0, a)
				in[a] = 1 - l
			default: // out
				lists[l].remove(a)
				want[l] = slices.Delete(want[l], j, j+1)
				delete(in, a)
				all = slices.Delete(all, at, at+1)
				if a.slot != 0 {
					t.Fatalf("step %d: a grain out of its list keeps handle %d", i, a.slot)
				}
			}
		}
		for l := range lists {
			var got []*grain
			for a := lists[l].front(); a != nil; a = table.next(a) {
				got = append(got, a)
			}
			var back []*grain
			for a := lists[l].back(); a != nil; a = table.prev(a) {
				back = append(back, a)
			}
			slices.Reverse(back)
			if !slices.Equal(got, want[l]) || !slices.Equal(back, want[l]) || lists[l].n != len(want[l]) {
				t.Fatalf("step %d: list %d has %d forwards and %d backwards, want %d in order", i, l, len(got), len(back), len(want[l]))
			}
		}
		if len(table.entries) > 0 && table.entries[0] != (tableEntry{}) {
			t.Fatalf("step %d: handle 0 (none) has %+v", i, table.entries[0])
		}
		held := 0
		for x, e := range table.entries {
			g := e.g
			if g == nil {
				continue
			}
			if _, ok := in[g]; !ok || g.slot != uint32(x) {
				t.Fatalf("step %d: the table holds a grain at %d that is not listed there", i, x)
			}
			held++
		}
		if held != len(all) || held+len(table.free) != len(table.entries)-1 {
			t.Fatalf("step %d: the table holds %d grains and %d free handles of %d, want %d grains", i, held, len(table.free), len(table.entries)-1, len(all))
		}
	}
}
