package fold

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

// copiedSpec is a pipeline whose states pack positionally, its window a
// minute or more (ids' times to the second) and short enough that a seed
// can expire some of its ids.
var copiedSpec = Spec{Key: "k", ID: "id", DedupWindow: time.Hour,
	Aggregates: map[string]AggregateSpec{"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}, "last": {Op: "last", Field: "s"}}}

// packedIDsOf returns the packed form of a state that applied ids events
// every gap ms from 1000, the ids as fingerprints if indexed; a state whose ids are in buckets is packed as the snapshot
// cache packs it, without its buckets' table (UnpackState's input).
func packedIDsOf(tb testing.TB, p *Pipeline, ids, gap int, indexed bool) []byte {
	var s State
	for i := range ids {
		ev, err := p.Prepare(fmt.Appendf(nil, `{"k":"a","id":"event-%d","v":%d,"s":"x%d"}`, i, i, i%3))
		if err != nil {
			tb.Fatal(err)
		}
		p.Apply(&s, ev, int64(1000+i*gap))
	}
	parts, err := p.Snapshot(&s, 0, nil, SnapshotOptions{IDIndex: indexed})
	if err != nil {
		tb.Fatal(err)
	}
	s.Persisted(parts.Version)
	data, err := p.AppendCached(nil, &s)
	if err != nil {
		tb.Fatal(err)
	}
	if data[0] == packedBuckets {
		r := packedReader{b: data[1:]}
		readBucketTable(&r, false)
		data = r.b
	}
	return data
}

// packedByHand returns a packed state (form packedEntries) of no
// aggregate values, its clock now, holding entries made by appendIDEntry
// of each delta (ms), with an id's bytes, or a fingerprint for every
// third.
func packedByHand(p *Pipeline, now int64, deltas ...int64) []byte {
	b := binary.AppendVarint(binary.AppendUvarint(binary.AppendUvarint([]byte{packedEntries}, 7), 0), now)
	for range p.aggs {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(deltas)))
	for i, d := range deltas {
		if i%3 == 2 {
			b = appendIDEntry(b, d, "", uint32(i+1))
		} else {
			b = appendIDEntry(b, d, fmt.Sprint("id-", i), 0)
		}
	}
	return b
}

// FuzzUnpackCopied: UnpackState copying a packed state's ids into the
// log (copyIDs) and adding them one by one unpack any bytes to the same
// state, ids, their times and buckets, or both refuse them.
func FuzzUnpackCopied(f *testing.F) {
	p, err := Compile("p", copiedSpec)
	if err != nil {
		f.Fatal(err)
	}
	for _, ids := range []int{1, 3, inlineIDs, inlineIDs + 1, 3 * partIDs} {
		for _, gap := range []int{1000, 25_000, 1234} {
			f.Add(packedIDsOf(f, p, ids, gap, false))
			f.Add(packedIDsOf(f, p, ids, gap, true))
		}
	}
	hour := time.Hour.Milliseconds()
	f.Add(packedByHand(p, 10*hour, -10*hour, 1000, 5*hour, 4*hour+1000)) // the first two expired
	f.Add(packedByHand(p, 10*hour, -hour, 2000, -1000, 3000))            // out of order
	f.Add(packedByHand(p, 10*hour, 0, 0, 7, -3))
	f.Add(packedByHand(p, math.MaxInt64-5, 0, 3, 4)) // times overflow
	f.Add(packedByHand(p, -math.MaxInt64, 0, maxIDDelta-1, maxIDDelta-1))
	f.Add(packedByHand(p, 0, -maxIDDelta, maxIDDelta/2))
	f.Fuzz(func(t *testing.T, data []byte) {
		copied, errC := p.unpackState(data, true)
		added, errA := p.unpackState(data, false)
		if (errC == nil) != (errA == nil) {
			t.Fatalf("copying the ids: %v; adding them: %v", errC, errA)
		}
		if errC != nil {
			return
		}
		sameUnpacked(t, p, &copied, &added)
	})
}

// sameUnpacked fails t unless a and b hold the same state: aggregates,
// clock, ids in order with their times, and buckets with the ids of
// their runs and last parts (the log's bytes and offsets may differ).
func sameUnpacked(t *testing.T, p *Pipeline, a, b *State) {
	t.Helper()
	if a.seq != b.seq || a.dups != b.dups || a.now != b.now || a.version != b.version || !reflect.DeepEqual(a.aggs, b.aggs) {
		t.Fatalf("states differ: %+v and %+v", a, b)
	}
	da, db := &a.ids, &b.ids
	if da.n != db.n || da.lastAt != db.lastAt || da.fps != db.fps || da.spilled != db.spilled ||
		da.indexed != db.indexed || (da.index == nil) != (db.index == nil) || !reflect.DeepEqual(da.gone, db.gone) {
		t.Fatalf("id sets differ: %d ids, last at %d, fps %v, spilled %v and %d, %d, %v, %v",
			da.n, da.lastAt, da.fps, da.spilled, db.n, db.lastAt, db.fps, db.spilled)
	}
	ia, ib := idsFrom(da.cursor(), -1), idsFrom(db.cursor(), -1)
	if !slices.Equal(ia, ib) {
		t.Fatalf("ids differ:\n%v\n%v", ia, ib)
	}
	if len(ia) > 0 && da.headAt > ia[0].at {
		t.Fatalf("headAt %d after the first id's time %d", da.headAt, ia[0].at)
	}
	if len(da.buckets) != len(db.buckets) {
		t.Fatalf("%d buckets and %d", len(da.buckets), len(db.buckets))
	}
	for i := range da.buckets {
		ba, bb := &da.buckets[i], &db.buckets[i]
		if ba.bucket != bb.bucket || ba.count != bb.count || ba.added != bb.added || ba.saved != bb.saved {
			t.Fatalf("bucket %d: %+v and %+v", i, ba, bb)
		}
		if ra, rb := idsFrom(da.runOf(ba), ba.count), idsFrom(db.runOf(bb), bb.count); !slices.Equal(ra, rb) {
			t.Fatalf("bucket %d's run: %v and %v", ba.bucket, ra, rb)
		}
		ta, _ := da.partAt(ba, ba.tailNum())
		tb, _ := db.partAt(bb, bb.tailNum())
		if ra, rb := idsFrom(ta, 1), idsFrom(tb, 1); !slices.Equal(ra, rb) {
			t.Fatalf("bucket %d's last part starts at %v and %v", ba.bucket, ra, rb)
		}
	}
	if _, err := p.SnapshotParts(a, RestoredVersion); err != nil {
		t.Fatalf("snapshot of the state copied: %v", err)
	}
}

type loggedID struct {
	id string
	fp bool
	at int64
}

// idsFrom reads n ids (negative: all) from c.
func idsFrom(c idCursor, n int) []loggedID {
	var out []loggedID
	for ; n != 0 && c.more(); n-- {
		e, at := c.next()
		out = append(out, loggedID{string(e), c.fp, at})
	}
	return out
}

// TestUnpackCopiesPackedIDs: what AppendPacked and the snapshot cache
// write has its ids copied (copyIDs takes it), with or without
// fingerprints, some expired by the state's clock, inline or beyond; and
// unpacked so, a state applies and expires as one whose ids were added.
func TestUnpackCopiesPackedIDs(t *testing.T) {
	p, err := Compile("p", copiedSpec)
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Hour.Milliseconds()
	cases := map[string][]byte{
		"one id":         packedIDsOf(t, p, 1, 1000, false),
		"fingerprints":   packedIDsOf(t, p, inlineIDs, 25_000, true),
		"beyond inline":  packedIDsOf(t, p, 3*partIDs, 1234, false),
		"first expired":  packedByHand(p, 10*hour, -10*hour, 1000, 5*hour, 4*hour+1000),
		"all expired":    packedByHand(p, 10*hour, -10*hour, 1000),
		"ms, not second": packedByHand(p, 10*hour, 0, 7, 1),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := p.unpackState(data, false)
			if err != nil {
				t.Fatal(err)
			}
			// Up to the ids, as UnpackState reads them.
			r := packedReader{b: data[1:]}
			fresh := State{seq: r.uvarint(), dups: r.uvarint(), now: r.varint()}
			for range p.aggs {
				if r.uvarint() > 0 {
					r.number()
					r.bytes(r.uvarint())
				}
			}
			n := r.uvarint()
			if !p.copyIDs(&fresh, &r, n, fresh.now-p.dedupWindow.Milliseconds()) || len(r.b) > 0 || r.err != nil {
				t.Fatalf("copyIDs refused its ids or left bytes (%d, %v)", len(r.b), r.err)
			}
			copied, err := p.UnpackState(data)
			if err != nil {
				t.Fatal(err)
			}
			// Written by appendIDEntry, the entries copied are the ones
			// adding them writes: the same log, byte for byte. (With
			// every id expired, adding leaves an empty log, copying none.)
			if s.ids.n == 0 && len(s.ids.log) == 0 {
				s.ids.log = nil
			}
			if !reflect.DeepEqual(copied, s) {
				t.Fatalf("copied, the state is\n%+v\nadded one by one\n%+v", copied, s)
			}
			// The same next: a new id, one of the first kept (a
			// duplicate), then an hour later (every id expires).
			kept := idsFrom(s.ids.cursor(), 1)
			for i, at := range []int64{s.now + 1000, s.now + 2000, s.now + 2*hour} {
				id := fmt.Sprint("new-", i)
				if i == 1 && len(kept) > 0 && !kept[0].fp {
					id = kept[0].id
				}
				ev, err := p.Prepare(fmt.Appendf(nil, `{"k":"a","id":%q,"v":1}`, id))
				if err != nil {
					t.Fatal(err)
				}
				if dc, da := p.Apply(&copied, ev, at), p.Apply(&s, ev, at); dc != da {
					t.Fatalf("id %q at %d: a duplicate %v copied, %v added", id, at, dc, da)
				}
				sameUnpacked(t, p, &copied, &s)
			}
		})
	}
}

// BenchmarkUnpackIDs: a key coming back into memory from the snapshot
// cache, its ids fingerprints 25 s apart (a million keys after minutes of
// load), unpacked with its ids copied (UnpackState) and added one by one
// (as before session 48).
func BenchmarkUnpackIDs(b *testing.B) {
	p, err := Compile("p", Spec{Key: "k", ID: "id", DedupWindow: 24 * time.Hour,
		Aggregates: copiedSpec.Aggregates})
	if err != nil {
		b.Fatal(err)
	}
	for _, ids := range []int{8, inlineIDs, 3 * partIDs} {
		data := packedIDsOf(b, p, ids, 25_000, true)
		for _, byCopy := range []bool{true, false} {
			b.Run(fmt.Sprintf("ids=%d/copied=%v", ids, byCopy), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					s, err := p.unpackState(data, byCopy)
					if err != nil || s.ids.len() != ids {
						b.Fatalf("%d ids, %v", s.ids.len(), err)
					}
				}
			})
		}
	}
}
