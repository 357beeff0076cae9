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

// TestRestoredFingerprintsSkipped: a state restored with its ids as
// fingerprints (from the snapshot cache, copied or added one by one, or
// from its stored parts) knows that none of them is for the index: the
// next snapshot hands over only the ids applied since, without walking
// past the fingerprints (indexed is where they end), as one that stayed
// in memory does.
func TestRestoredFingerprintsSkipped(t *testing.T) {
	p, err := Compile("p", copiedSpec)
	if err != nil {
		t.Fatal(err)
	}
	for _, ids := range []int{1, 5, inlineIDs, inlineIDs + 1, 3 * partIDs} {
		data := packedIDsOf(t, p, ids, 25_000, true)
		for _, byCopy := range []bool{true, false} {
			what := fmt.Sprintf("%d ids, copied %v", ids, byCopy)
			s, err := p.unpackState(data, byCopy)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if int(s.ids.indexed) != len(s.ids.log) {
				t.Fatalf("%s: indexed at %d, the fingerprints end at %d", what, s.ids.indexed, len(s.ids.log))
			}
			ev, err := p.Prepare([]byte(`{"k":"a","id":"new","v":1,"s":"y"}`))
			if err != nil {
				t.Fatal(err)
			}
			now := int64(1000 + ids*25_000)
			if v := p.ApplyEvent(&s, ev, now); v != Applied {
				t.Fatalf("%s: a new id: %v", what, v)
			}
			want := []IndexedID{{ID: "new", At: now}}
			if got := unindexedByWalk(&s.ids); !slices.Equal(got, want) {
				t.Fatalf("%s: by the walk: %v, want %v", what, got, want)
			}
			if int(s.ids.indexed) <= int(s.ids.head) {
				t.Fatalf("%s: unindexed would walk the fingerprints", what)
			}
			if got := s.ids.unindexed(nil, s.version); !slices.Equal(got, want) {
				t.Fatalf("%s: %v, want %v", what, got, want)
			}
		}
	}
}
