package actors

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestGrainIndexAgainstMap drives the registry's index with random puts
// (new keys, and new grains for keys it holds) and removals (of the key's
// grain, and of a grain it no longer holds) against a map, through growth
// and at its fullest, checking after every step that it finds what the
// map holds and nothing else, and that every slot is reachable from its
// key's home slot (what a removal's backward shift must keep).
func TestGrainIndexAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := newGrainIndex()
	want := map[keyID]*grain{}
	var replaced []*grain // grains put in place of which another was
	keys := 0
	newGrain := func(id keyID) *grain { return &grain{id: id} }
	for step := range 40_000 {
		switch r := rng.IntN(10); {
		case r < 5 || len(want) == 0: // a key not held
			id := keyID{pipeline: []string{"a", "b"}[keys%2], key: fmt.Sprint(keys)}
			keys++
			g := newGrain(id)
			x.put(g)
			want[id] = g
		case r < 6: // a new grain for a key held
			for id, old := range want {
				g := newGrain(id)
				x.put(g)
				want[id] = g
				replaced = append(replaced, old)
				break
			}
		case r < 7 && len(replaced) > 0: // a grain no longer held: nothing changes
			x.remove(replaced[rng.IntN(len(replaced))])
		default:
			for id, g := range want {
				x.remove(g)
				delete(want, id)
				break
			}
		}
		if x.n != len(want) {
			t.Fatalf("step %d: %d keys, want %d", step, x.n, len(want))
		}
		if step%97 != 0 && step < 39_000 {
			continue
		}
		for id, g := range want {
			if got := x.get(id); got != g {
				t.Fatalf("step %d: key %v: grain %p, want %p", step, id, got, g)
			}
		}
		for i := range 50 {
			if id := (keyID{pipeline: "a", key: fmt.Sprint(keys + i)}); x.get(id) != nil {
				t.Fatalf("step %d: key %v never put is found", step, id)
			}
		}
		mask := len(x.slots) - 1
		held := 0
		for i, s := range x.slots {
			if s.hash == 0 {
				continue
			}
			held++
			if s.hash != x.hashOf(s.g.id) {
				t.Fatalf("step %d: slot %d holds hash %x for key %v, whose hash is %x", step, i, s.hash, s.g.id, x.hashOf(s.g.id))
			}
			for j := int(s.hash) & mask; j != i; j = (j + 1) & mask {
				if x.slots[j].hash == 0 {
					t.Fatalf("step %d: slot %d is not reachable from its key's home %d (slot %d is empty)", step, i, int(s.hash)&mask, j)
				}
			}
		}
		if held != len(want) {
			t.Fatalf("step %d: %d slots held, want %d", step, held, len(want))
		}
	}
	if len(x.slots) <= minIndexSlots {
		t.Fatalf("the index never grew (%d slots)", len(x.slots))
	}
	x.clear()
	if x.n != 0 || x.get(keyID{"a", "1"}) != nil {
		t.Fatal("a cleared index holds keys")
	}
}
