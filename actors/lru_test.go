package actors

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The LRU list against a slice kept in the same order, over random
// activations, uses and removals.
func TestLRUOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var l lru[grain, *grain]
	var want []*grain // most recent first
	all := map[int]*grain{}
	for i := range 5000 {
		switch k := rng.IntN(40); {
		case rng.IntN(3) == 0 || len(all) == 0: // activate
			a := &grain{group: uint32(i)}
			all[i] = a
			l.pushFront(a)
			want = slices.Insert(want, 0, a)
		default:
			var a *grain
			for _, x := range all {
				a = x
				break
			}
			j := slices.Index(want, a)
			if k < 20 { // use
				l.touch(a)
				want = slices.Insert(slices.Delete(want, j, j+1), 0, a)
			} else { // passivate
				l.remove(a)
				want = slices.Delete(want, j, j+1)
				delete(all, int(a.group))
			}
		}
		var got []*grain
		for a := l.head; a != nil; a = a.order.next {
			got = append(got, a)
		}
		var back []*grain
		for a := l.tail; a != nil; a = a.order.prev {
			back = append(back, a)
		}
		slices.Reverse(back)
		if !slices.Equal(got, want) || !slices.Equal(back, want) || l.n != len(want) {
			t.Fatalf("step %d: the list has %d forwards and %d backwards, want %d in order", i, len(got), len(back), len(want))
		}
	}
}
