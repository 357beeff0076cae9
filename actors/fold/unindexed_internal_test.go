package fold

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// unindexedByWalk is what idSet.unindexed hands over, found the long way:
// every id from the oldest, each one's time summed from baseAt.
func unindexedByWalk(d *idSet) []IndexedID {
	var ids []IndexedID
	for c := d.cursor(); c.more(); {
		off := c.off
		if e, at := c.next(); !c.fp && off >= int(d.indexed) {
			ids = append(ids, IndexedID{ID: string(e), At: at})
		}
	}
	return ids
}

// TestUnindexedCountsBack: the ids a snapshot hands to the store's index,
// their times counted back from the newest id's, are those and the times
// a walk from the oldest id finds, whatever came before: ids in full and
// fingerprints, times in whole seconds and in ms, out of order or far
// apart (clamped), expiry, compaction, buckets, snapshots stored, lost or
// superseded. A wrong time would file an id under another minute of the
// index, where a resent copy is not looked for.
func TestUnindexedCountsBack(t *testing.T) {
	reached := map[string]int{}
	for seed := range uint64(24) {
		r := rand.New(rand.NewPCG(seed, 49))
		var d idSet
		width := int64(60_000)
		if seed%3 == 1 {
			width = 1_000 // many buckets
		}
		now := int64(1_700_000_000_000)
		if seed%4 == 3 {
			now = -90_000 // negative times, then crossing zero
		}
		var version uint64
		var pending []uint64 // versions of snapshots that handed ids over, not yet stored
		for step := range 1500 {
			what := fmt.Sprintf("seed %d step %d", seed, step)
			switch op := r.IntN(100); {
			case op < 55: // an id applied
				switch k := r.IntN(20); {
				case k < 12:
					now += 1000 * int64(r.IntN(40)) // whole seconds, as under a window of a minute or more
				case k < 17:
					now += int64(r.IntN(5000)) // ms
				case k == 17:
					now -= int64(r.IntN(3000)) // back
				case k == 18:
					now += 1 << 61 // beyond what an entry keeps: clamped
					reached["clamped"]++
				}
				version++
				if r.IntN(8) == 0 {
					d.addFingerprint(r.Uint32()|1, now, width)
				} else {
					d.add(fmt.Sprintf("id-%d-%d", seed, step), now, width)
				}
			case op < 65: // expiry
				version++
				d.expire(now-int64(r.IntN(200_000)), width, version)
			case op < 85: // a snapshot hands its ids over
				want := unindexedByWalk(&d)
				if int(d.indexed) > int(d.head) && len(want) > 0 {
					reached["from indexed"]++
				}
				got := d.unindexed(nil, version)
				if !slices.Equal(got, want) {
					t.Fatalf("%s: unindexed = %v, want %v", what, got, want)
				}
				pending = append(pending, version)
			case op < 95: // one of them stored
				if len(pending) == 0 {
					continue
				}
				i := r.IntN(len(pending))
				d.persisted(pending[i])
				pending = pending[i+1:]
			default: // a snapshot handing none over: the last mark dropped
				d.unmark()
			}
		}
		if d.n > 0 && len(d.buckets) > 0 {
			reached["buckets"]++
		}
	}
	for _, k := range []string{"clamped", "from indexed", "buckets"} {
		if reached[k] == 0 {
			t.Errorf("no seed reached %q: %v", k, reached)
		}
	}
}
