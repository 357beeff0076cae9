package fold

import (
	"fmt"
	"testing"
	"time"
)

// FuzzUnpackCached: whatever the bytes, UnpackCached returns a state or an
// error, without panicking; a state it returns snapshots, and one with ids
// in buckets knows every id's bucket. StoredCached too returns bytes or an
// error.
func FuzzUnpackCached(f *testing.F) {
	p, err := Compile("p", Spec{Key: "k", ID: "id", DedupWindow: time.Hour,
		Aggregates: map[string]AggregateSpec{"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}}})
	if err != nil {
		f.Fatal(err)
	}
	// Seeds: clean states with a few ids (packed), and with ids in one or
	// several buckets and parts (the cache's own form); the same changed,
	// as the spill keeps them (its own form), one with buckets to delete.
	for i, ids := range []int{0, 3, inlineIDs + 1, 3 * partIDs, 3, 3 * partIDs} {
		var s State
		for i := range ids {
			ev, err := p.Prepare(fmt.Appendf(nil, `{"k":"a","id":"e%d","v":%d}`, i, i))
			if err != nil {
				f.Fatal(err)
			}
			p.Apply(&s, ev, int64(1000+i*20_000))
		}
		if i == 5 { // its first buckets' ids expire
			ev, err := p.Prepare([]byte(`{"k":"a","id":"late","v":1}`))
			if err != nil {
				f.Fatal(err)
			}
			p.Apply(&s, ev, int64(1000+ids*20_000)+time.Hour.Milliseconds())
		}
		spilled, err := p.AppendSpilled(nil, &s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(spilled)
		// (The last two as fingerprints: the store's index holds them.)
		parts, err := p.Snapshot(&s, 0, nil, SnapshotOptions{IDIndex: i >= 4})
		if err != nil {
			f.Fatal(err)
		}
		s.Persisted(parts.Version)
		data, err := p.AppendCached(nil, &s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/2])
	}
	f.Add([]byte{packedBuckets, 1, 2, 0})                   // a bucket numbered 0 ids
	f.Add([]byte{packedBuckets, 2, 4, 1, 2, 1, packedCore}) // buckets out of order
	f.Add([]byte{packedBuckets, 0, packedBuckets, 0})       // nested
	f.Add([]byte{packedChanged, 1, 2, 3, 4, 0, packedCore}) // lacks more ids than it numbered
	f.Add([]byte{packedChanged, 0, 1, 2, 0, packedCore})    // a bucket to delete of no parts
	f.Fuzz(func(t *testing.T, data []byte) {
		StoredCached(nil, data)
		s, err := p.UnpackCached(data)
		if err != nil {
			return
		}
		for _, g := range s.ids.gone {
			if g.parts > 1<<12 {
				return // (a snapshot would list its parts for deletion, millions)
			}
		}
		if _, err := p.SnapshotParts(&s, RestoredVersion); err != nil {
			t.Fatalf("snapshot of a decoded state: %v", err)
		}
		if s.ids.spilled {
			w := p.bucketWidth()
			for c := s.ids.cursor(); c.more(); {
				if _, at := c.next(); !func() bool { _, ok := s.ids.find(at / w); return ok }() {
					t.Fatalf("id at %d has no bucket", at)
				}
			}
		}
	})
}
