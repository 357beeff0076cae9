package actors

import "testing"

func TestRoundSizeCapFor(t *testing.T) {
	for _, c := range []struct {
		name    string
		last    roundSize
		keys, n int
		want    int
	}{
		{"first round: an entry a key", roundSize{}, 1000, 0, 1000},
		{"an id a key", roundSize{keys: 1000, ids: 1000}, 800, 1000, 851},
		{"three ids a key", roundSize{keys: 1000, ids: 3000}, 1000, 3000, 3188},
		{"half the keys with ids", roundSize{keys: 1000, ids: 500}, 2000, 500, 1063},
		{"a few keys of many ids: at most twice the last and a key each", roundSize{keys: 2, ids: 3000}, 4000, 3000, 10000},
		{"no keys now", roundSize{keys: 10, ids: 10}, 0, 10, 1},
	} {
		if got := c.last.capFor(c.keys, c.n); got != c.want {
			t.Errorf("%s: capFor(%d, %d) after %+v = %d, want %d", c.name, c.keys, c.n, c.last, got, c.want)
		}
	}
}
