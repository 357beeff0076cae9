package cluster

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/keyfold/keyfold/actors"
)

// Three members on one host (ids differing only in their port, the worst
// case for a weak hash) each own 33% ± 5% of the groups and of the keys.
func TestPlacementBalanced(t *testing.T) {
	members := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	const groups = 256
	a := Assign(members, groups)
	keys := map[string]int{}
	const n = 300_000
	for i := range n {
		keys[a.Owner(actors.GroupOf(fmt.Sprintf("user-%d", i), groups))]++
	}
	for _, m := range members {
		g := float64(len(a.Groups(m))) / groups
		k := float64(keys[m]) / n
		t.Logf("%s: %.1f%% of groups, %.1f%% of keys", m, 100*g, 100*k)
		if math.Abs(g-1.0/3) > 0.05 || math.Abs(k-1.0/3) > 0.05 {
			t.Errorf("%s owns %.1f%% of groups and %.1f%% of keys, want 33%% ± 5%%", m, 100*g, 100*k)
		}
	}
}

// A join moves little more than the 1/N of the groups the new member takes;
// a leave little more than the leaver's groups (bounded loads move a few
// others).
func TestPlacementMovesLittle(t *testing.T) {
	const groups = 256
	for _, c := range []struct {
		from, to []string
	}{
		{[]string{"n1:1", "n2:1", "n3:1"}, []string{"n1:1", "n2:1", "n3:1", "n4:1"}},
		{[]string{"n1:1", "n2:1", "n3:1"}, []string{"n1:1", "n3:1"}},
		{[]string{"n1:1", "n2:1"}, []string{"n1:1", "n2:1", "n3:1"}},
	} {
		a, b := Assign(c.from, groups), Assign(c.to, groups)
		moved := len(Moved(a, b))
		// The least that must move: the groups a joiner takes or a leaver had.
		least := 0
		for _, m := range c.to {
			if !slices.Contains(c.from, m) {
				least += len(b.Groups(m))
			}
		}
		for _, m := range c.from {
			if !slices.Contains(c.to, m) {
				least += len(a.Groups(m))
			}
		}
		t.Logf("%v → %v: %d groups moved, %d had to", c.from, c.to, moved, least)
		if float64(moved) > 1.25*float64(least) {
			t.Errorf("%v → %v moved %d groups; at least %d had to, want at most 25%% more", c.from, c.to, moved, least)
		}
	}
}

func TestPlacementEdges(t *testing.T) {
	if o := Owner(nil, 3); o != "" {
		t.Errorf("no members: owner %q", o)
	}
	a := Assign([]string{"x", "x", "y"}, 8) // duplicates count once
	if len(a.Members) != 2 || a.Owner(99) != "" {
		t.Errorf("members %v, owner of an unknown group %q", a.Members, a.Owner(99))
	}
	// Deterministic whatever the order of the list.
	b := Assign([]string{"y", "x"}, 8)
	if len(Moved(a, b)) != 0 {
		t.Error("the same members in another order place groups differently")
	}
}
