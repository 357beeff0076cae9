package fold_test

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
)

// TestFingerprintIsPinned: fingerprints are stored with the keys' states,
// so the function that makes them must never change.
func TestFingerprintIsPinned(t *testing.T) {
	for id, want := range map[string]uint32{
		"e1":                 0xbb3699f7,
		"login-42":           0x165e6da2,
		"benchRun-123456789": 0xe04f9b70,
	} {
		if got := fold.Fingerprint(id); got != want {
			t.Errorf("Fingerprint(%q) = %#x, want %#x", id, got, want)
		}
	}
}

// idStore is what a store with an id index keeps of one key: its snapshot
// (packed, or a core and id bucket parts) and the index's entries.
type idStore struct {
	packed []byte
	ps     *partsStore
	index  map[indexEntry]int64 // → the time the id was stored with
}

type indexEntry struct {
	bucket int64
	id     string
}

func newIDStore() *idStore {
	return &idStore{ps: &partsStore{buckets: map[bucketPart][]byte{}}, index: map[indexEntry]int64{}}
}

func (st *idStore) store(parts fold.Parts) {
	if parts.Packed {
		st.packed = slices.Clone(parts.CoreData)
		st.ps.store(fold.Parts{Buckets: parts.Buckets})
	} else {
		st.packed = nil
		st.ps.store(parts)
	}
	for _, id := range parts.IDs {
		st.index[indexEntry{fold.IndexBucket(id.At), id.ID}] = id.At
	}
}

func (st *idStore) restore(t *testing.T, p *fold.Pipeline) fold.State {
	t.Helper()
	if st.packed != nil {
		s, err := p.UnpackState(st.packed)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if st.ps.core == nil {
		return fold.State{}
	}
	return st.ps.restore(t, p)
}

// apply applies ev as a key's actor does: looking its id up in the index
// when the state asks for it. It returns the verdict and whether it looked.
func (st *idStore) apply(p *fold.Pipeline, s *fold.State, ev *fold.Event, now int64) (fold.Verdict, bool) {
	v := p.ApplyEvent(s, ev, now)
	if v != fold.LookUp {
		return v, false
	}
	var found int64
	for _, at := range p.IDLookups(s, ev) {
		found = max(found, st.index[indexEntry{fold.IndexBucket(at), ev.ID}])
	}
	ev.SetIndexed(found)
	v = p.ApplyEvent(s, ev, now)
	if v == fold.LookUp {
		panic("LookUp after the look-up")
	}
	return v, true
}

// TestIDIndexAgainstOracle: a key's ids stored in the index, its snapshots
// holding only their fingerprints, decide every event exactly as a set of
// every id applied within the window does, through checkpoints that fail,
// crashes replayed from the last checkpoint, trips through the snapshot
// cache and the spill, and buckets; with real fingerprints and with ones
// made to collide (so that most new ids are looked up); with every
// checkpoint using the index, and with checkpoints that use it or not at
// random (a host indexes ids only while keys leave memory). A replay
// decides each event as its first run did.
func TestIDIndexAgainstOracle(t *testing.T) {
	packable := fold.Spec{Key: "user_id", ID: "event_id", DedupWindow: 3 * time.Second,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}, "amount": {Op: "sum", Field: "amount"}}}
	// Under a window of a minute or more ids' times are kept rounded up
	// to the second (the oracle rounds them so too).
	// (Its even seeds keep ids in buckets.)
	seconds := packable
	seconds.DedupWindow = 2 * time.Minute
	specs := map[string]fold.Spec{"packed": packable, "parts": fuzzSpec, "seconds": seconds}
	seeds := uint64(6)
	if raceDetector {
		seeds = 3
	}
	for name, spec := range specs {
		for _, mode := range []string{"collide", "distinct", "mixed"} {
			collide := mode != "distinct"
			for seed := range seeds {
				t.Run(fmt.Sprintf("%s/%s/%d", name, mode, seed), func(t *testing.T) {
					if collide {
						defer fold.SetFingerprintForTest(func(id string) uint32 {
							h := fnv.New32a()
							h.Write([]byte(id))
							return h.Sum32()%3 + 1
						})()
					}
					runIDIndexOracle(t, mustCompile(t, spec), seed, mode == "mixed")
				})
			}
		}
	}
}

func runIDIndexOracle(t *testing.T, p *fold.Pipeline, seed uint64, mixed bool) {
	rng := rand.New(rand.NewPCG(seed, 11))
	window := p.DedupWindow().Milliseconds()
	st := newIDStore()
	var s fold.State
	since := uint64(0) // what the state was last told is stored
	type logged struct {
		raw     string
		now     int64
		verdict fold.Verdict
	}
	var log []logged // applied since the last checkpoint
	oracle := map[string]int64{}
	oracleNow := int64(0)
	var ids []string
	now := int64(1_700_000_000_000)
	// Events a 150th of the window apart on average keep 150 ids in it
	// (in buckets); in odd seeds 15 (inline, packed).
	gap := int(window / 75)
	if seed%2 == 1 {
		gap *= 10
	}
	applied, looked, crashes, cached, spilled, multi := 0, 0, 0, 0, 0, false
	for step := range 3000 {
		switch op := rng.IntN(100); {
		case op < 70: // an event
			now += int64(rng.IntN(gap))
			if rng.IntN(200) == 0 {
				now += window * int64(1+rng.IntN(3)) // everything expires
			}
			var id string
			switch k := rng.IntN(10); {
			case k < 4 && len(ids) > 0: // a resend, recent or not
				id = ids[max(0, len(ids)-1-rng.IntN(min(len(ids), 200)))]
			default:
				id = fmt.Sprintf("e%d", len(ids))
				ids = append(ids, id)
			}
			raw := fmt.Sprintf(`{"user_id":"k","event_id":%q,"amount":1,"ts":%d}`, id, now)
			v, l := st.apply(p, &s, prepare(t, p, raw), now)
			if l {
				looked++
			}
			oracleNow = max(oracleNow, now)
			want := fold.Applied
			if at, ok := oracle[id]; ok && at > oracleNow-window {
				want = fold.Duplicate
			} else {
				oracle[id] = oracleNow
				if window >= time.Minute.Milliseconds() && oracleNow%1000 != 0 {
					oracle[id] = oracleNow - oracleNow%1000 + 1000 // (times here are positive)
				}
				applied++
			}
			if v != want {
				t.Fatalf("step %d: %s at %d: %v, want %v", step, id, now, v, want)
			}
			log = append(log, logged{raw, now, v})
		case op < 82: // a checkpoint, sometimes failing
			index := !mixed || rng.IntN(2) == 0
			parts, err := p.Snapshot(&s, since, nil, fold.SnapshotOptions{Packed: true, IDIndex: index, PackedParts: step%3 != 0})
			if err != nil {
				t.Fatal(err)
			}
			multi = multi || len(parts.Buckets) > 0
			if !index && len(parts.IDs) > 0 {
				t.Fatalf("step %d: a snapshot without the index hands over %d ids", step, len(parts.IDs))
			}
			if rng.IntN(5) == 0 {
				continue // not stored: the next one hands the ids again
			}
			st.store(parts)
			s.Persisted(parts.Version)
			since, log = parts.Version, nil
		case op < 88: // a crash: the last checkpoint, then the log since
			crashes++
			s = st.restore(t, p)
			since = min(s.Version(), fold.RestoredVersion)
			for i, e := range log {
				if v, _ := st.apply(p, &s, prepare(t, p, e.raw), e.now); v != e.verdict {
					t.Fatalf("step %d: replay of log entry %d (%s) decided %v, its first run %v", step, i, e.raw, v, e.verdict)
				}
			}
		case op < 94: // a clean key leaves memory for the snapshot cache
			if s.Version() > since {
				continue
			}
			b, err := p.AppendCached(nil, &s)
			if err != nil {
				t.Fatal(err)
			}
			if s, err = p.UnpackCached(b); err != nil {
				t.Fatal(err)
			}
			since = min(s.Version(), fold.RestoredVersion)
			cached++
		default: // a changed key leaves memory for the spill
			if !s.Packable() || s.Version() <= since {
				continue
			}
			b, err := p.AppendPacked(nil, &s)
			if err != nil {
				t.Fatal(err)
			}
			if s, err = p.UnpackState(b); err != nil {
				t.Fatal(err)
			}
			since = min(s.Version(), fold.RestoredVersion)
			spilled++
		}
		if got := s.Seq(); got != uint64(applied) {
			t.Fatalf("step %d: seq %d, want %d", step, got, applied)
		}
	}
	if crashes == 0 || cached == 0 || spilled == 0 || looked == 0 {
		t.Fatalf("not every path ran: crashes %d, cached %d, spilled %d, look-ups %d", crashes, cached, spilled, looked)
	}
	t.Logf("applied %d, look-ups %d, crashes %d, cached %d, spilled %d, buckets %v, index %d", applied, looked, crashes, cached, spilled, multi, len(st.index))
}

// TestIDIndexSnapshotHoldsFingerprints: a snapshot for a store with an id
// index hands the ids it lacks to the checkpoint once (Parts.IDs) and
// holds only their fingerprints; restored, the key looks an old id up only
// when an event carries it, and decides a new one without a look-up.
func TestIDIndexSnapshotHoldsFingerprints(t *testing.T) {
	p := mustCompile(t, fold.Spec{Key: "user_id", ID: "event_id", DedupWindow: time.Hour,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	ev := func(id string) *fold.Event {
		return prepare(t, p, fmt.Sprintf(`{"user_id":"k","event_id":%q}`, id))
	}
	now := int64(1_700_000_000_000)
	var s fold.State
	for i := range 10 {
		p.Apply(&s, ev(fmt.Sprintf("long-event-id-%04d", i)), now+int64(i)*1000) // (whole seconds: kept as they are)
	}
	withIDs, err := p.Snapshot(&s, 0, nil, fold.SnapshotOptions{Packed: true})
	if err != nil {
		t.Fatal(err)
	}
	parts, err := p.Snapshot(&s, 0, nil, fold.SnapshotOptions{Packed: true, IDIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(parts.IDs) != 10 || parts.IDs[0] != (fold.IndexedID{ID: "long-event-id-0000", At: now}) {
		t.Fatalf("IDs = %v, want the 10 ids", parts.IDs)
	}
	if len(parts.CoreData) >= len(withIDs.CoreData)-10*10 {
		t.Fatalf("snapshot with fingerprints takes %d B, with ids %d B", len(parts.CoreData), len(withIDs.CoreData))
	}
	// Not stored: the next snapshot hands them again; stored, it does not.
	if again, _ := p.Snapshot(&s, 0, nil, fold.SnapshotOptions{Packed: true, IDIndex: true}); len(again.IDs) != 10 {
		t.Fatalf("before Persisted: IDs = %d, want 10 again", len(again.IDs))
	}
	s.Persisted(parts.Version)
	p.Apply(&s, ev("new"), now+20)
	if next, _ := p.Snapshot(&s, parts.Version, nil, fold.SnapshotOptions{Packed: true, IDIndex: true}); len(next.IDs) != 1 || next.IDs[0].ID != "new" {
		t.Fatalf("after Persisted: IDs = %v, want the new id alone", next.IDs)
	}

	r, err := p.UnpackState(parts.CoreData)
	if err != nil {
		t.Fatal(err)
	}
	if v := p.ApplyEvent(&r, ev("other"), now+30); v != fold.Applied {
		t.Fatalf("a new id: %v, want Applied without a look-up", v)
	}
	old := ev("long-event-id-0003")
	if v := p.ApplyEvent(&r, old, now+31); v != fold.LookUp {
		t.Fatalf("an old id: %v, want LookUp", v)
	}
	if ats := p.IDLookups(&r, old); !slices.Equal(ats, []int64{now + 3000}) {
		t.Fatalf("IDLookups = %v, want [%d]", ats, now+3000)
	}
	old.SetIndexed(now + 3000)
	if v := p.ApplyEvent(&r, old, now+31); v != fold.Duplicate {
		t.Fatalf("an old id the index holds: %v, want Duplicate", v)
	}
	// An id of the same fingerprint the index does not hold is new.
	fp5 := fold.Fingerprint("long-event-id-0005")
	defer fold.SetFingerprintForTest(func(string) uint32 { return fp5 })()
	twin := ev("twin")
	if v := p.ApplyEvent(&r, twin, now+32); v != fold.LookUp {
		t.Fatalf("a colliding id: %v, want LookUp", v)
	}
	twin.SetIndexed(0)
	if v := p.ApplyEvent(&r, twin, now+32); v != fold.Applied {
		t.Fatalf("a colliding id the index lacks: %v, want Applied", v)
	}
	// Held in full now (applied since the restore): no look-up.
	if v := p.ApplyEvent(&r, ev("twin"), now+33); v != fold.Duplicate {
		t.Fatalf("the colliding id again: %v, want Duplicate", v)
	}
	// Stored, but longer than the window ago (as the index may hold it
	// until its bucket is dropped): new.
	late := ev("long-event-id-0005")
	late.SetIndexed(now + 34 - time.Hour.Milliseconds())
	if v := p.ApplyEvent(&r, late, now+34); v != fold.Applied {
		t.Fatalf("an id the index holds from before the window: %v, want Applied", v)
	}
}

// TestIDIndexEraseForgetsFingerprints: an erased key holds no fingerprint,
// so an id it applied before counts again without a look-up, though the
// index still holds it.
func TestIDIndexEraseForgetsFingerprints(t *testing.T) {
	p := mustCompile(t, fold.Spec{Key: "user_id", ID: "event_id", DedupWindow: time.Hour,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	st := newIDStore()
	now := int64(1_700_000_000_000)
	var s fold.State
	p.Apply(&s, prepare(t, p, `{"user_id":"k","event_id":"a"}`), now)
	parts, err := p.Snapshot(&s, 0, nil, fold.SnapshotOptions{Packed: true, IDIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	st.store(parts)
	r := st.restore(t, p)
	p.Apply(&r, fold.Tombstone("k"), now+1)
	if v, looked := st.apply(p, &r, prepare(t, p, `{"user_id":"k","event_id":"a"}`), now+2); v != fold.Applied || looked {
		t.Fatalf("after erase: %v, looked up %v; want Applied without a look-up", v, looked)
	}
}
