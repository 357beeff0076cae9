package fold_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// partsStore is a stored snapshot in its parts, as the host keeps it.
type partsStore struct {
	core    *keyfoldv1.KeyState
	buckets map[bucketPart][]byte
	written int // bucket part writes
}

type bucketPart struct {
	bucket int64
	part   int
}

func (ps *partsStore) store(p fold.Parts) {
	core, err := p.CoreState()
	if err != nil {
		panic(err)
	}
	ps.core = proto.Clone(core).(*keyfoldv1.KeyState)
	for _, b := range p.Buckets {
		ps.written++
		if b.Data == nil {
			delete(ps.buckets, bucketPart{b.Bucket, b.Part})
		} else {
			ps.buckets[bucketPart{b.Bucket, b.Part}] = b.Data
		}
	}
}

func (ps *partsStore) restore(t *testing.T, p *fold.Pipeline) fold.State {
	t.Helper()
	s, err := p.RestoreParts(ps.core, loadFrom(ps))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSnapshotPartsRestoreExactly: storing only the parts that changed
// since the last stored version (with some stores failing and retried)
// always restores exactly the state in memory, and the restored state
// continues exactly as the original does.
func TestSnapshotPartsRestoreExactly(t *testing.T) {
	p := mustCompile(t, fuzzSpec) // dedup window 3s: 16 buckets of 187ms
	seeds := uint64(30)
	if raceDetector {
		seeds = 6
	}
	// A gap of up to 60 ms between events fills a bucket with a few ids;
	// up to 2 ms, with several parts of partIDs (a checkpoint writes its
	// last part or two, read from where the last part starts).
	for seed := range seeds {
		gap, events, every := int64(60), 2000, 10
		if seed%6 == 5 {
			gap, events, every = 2, 8000, 50
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			var s fold.State
			ps := &partsStore{buckets: map[bucketPart][]byte{}}
			stored := uint64(0)
			now := int64(0)
			multipart := false
			for i := range events {
				now += rng.Int64N(gap) // ms
				id := fmt.Sprintf("e%d", rng.IntN(i+1))
				if gap == 2 {
					id = fmt.Sprintf("u%d", i) // unique: enough to fill parts
				}
				ev := prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":%q,"amount":%d}`, id, rng.IntN(100)))
				p.Apply(&s, ev, now)
				if rng.IntN(every) != 0 {
					continue
				}
				parts, err := p.SnapshotParts(&s, stored)
				if err != nil {
					t.Fatal(err)
				}
				if rng.IntN(5) == 0 {
					continue // the checkpoint failed: nothing stored, nothing acknowledged
				}
				ps.store(parts)
				s.Persisted(parts.Version)

				r := ps.restore(t, p)
				if !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
					t.Fatalf("event %d: restored state differs:\n got %v\nwant %v", i, stateProto(p, &r), stateProto(p, &s))
				}
				// The restored copy and the original continue alike.
				for j := range 20 {
					ev := prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":"e%d"}`, j*7))
					if d1, d2 := p.Apply(&s, ev, now), p.Apply(&r, ev, now); d1 != d2 {
						t.Fatalf("event %d: duplicate %v in memory, %v restored", i, d1, d2)
					}
				}
				// The restored copy becomes the live one (passivation and
				// reactivation): its parts are all stored.
				s, stored = r, fold.RestoredVersion
				parts, err = p.SnapshotParts(&s, stored)
				if err != nil {
					t.Fatal(err)
				}
				wasInline := len(ps.core.GetSeenBuckets()) == 0
				if listed := mustCore(t, parts).GetSeenBuckets(); wasInline && len(listed) > 0 {
					// The 20 extra events spilled the ids out of the
					// core: every bucket it lists is written.
					if written := countData(parts); written != len(listed) {
						t.Fatalf("ids spilled into %d buckets, %d written", len(listed), written)
					}
				} else if n := changedBuckets(parts); n > 1 {
					// They changed the newest bucket only.
					t.Fatalf("after restore %d buckets changed, want at most 1", n)
				}
				ps.store(parts)
				s.Persisted(parts.Version)
				stored = parts.Version
				multipart = multipart || len(ps.core.GetSeenBucketParts()) > 0
			}
			if gap == 2 && !multipart {
				t.Fatal("no bucket was stored in more than one part")
			}
		})
	}
}

// TestSnapshotPartsWriteOnlyWhatChanged: a key receiving ids all day
// writes a part or two of its newest bucket per checkpoint and deletes the
// parts of one that emptied, not its whole dedup window, nor its newest
// bucket's whole fill (1,080 ids here: five parts).
func TestSnapshotPartsWriteOnlyWhatChanged(t *testing.T) {
	p := dedupPipeline(t, 24*time.Hour)
	var s fold.State
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	stored := uint64(0)
	now := int64(0)
	checkpoints := 0
	for i := range 26 * 720 { // 26 hours, an event every 5s
		now += 5000
		p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":"e%d"}`, i)), now)
		if i%2 == 1 { // a checkpoint every 10s
			parts, err := p.SnapshotParts(&s, stored)
			if err != nil {
				t.Fatal(err)
			}
			written, deleted := 0, map[int64]bool{}
			for _, b := range parts.Buckets {
				if b.Data == nil {
					deleted[b.Bucket] = true
					continue
				}
				var sb keyfoldv1.SeenBucket
				if err := proto.Unmarshal(b.Data, &sb); err != nil {
					t.Fatal(err)
				}
				written += len(sb.Ids)
			}
			if written > 2*256 || len(deleted) > 1 {
				t.Fatalf("checkpoint at %ds wrote %d ids and deleted %d buckets", i, written, len(deleted))
			}
			ps.store(parts)
			s.Persisted(parts.Version)
			stored = parts.Version
			checkpoints++
		}
	}
	buckets := map[int64]bool{}
	for b := range ps.buckets {
		buckets[b.bucket] = true
	}
	if got := len(buckets); got > 17 {
		t.Errorf("%d buckets stored for a 24h window, want at most 17", got)
	}
	r := ps.restore(t, p)
	if !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
		t.Fatal("restored state differs")
	}
	t.Logf("%d checkpoints wrote %d buckets; %d ids remembered", checkpoints, ps.written, len(stateProto(p, &s).Seen))
}

// countData counts the buckets parts write (not delete).
// countData is the number of buckets of which parts has data to write.
func countData(parts fold.Parts) int {
	written := map[int64]bool{}
	for _, b := range parts.Buckets {
		if b.Data != nil {
			written[b.Bucket] = true
		}
	}
	return len(written)
}

// changedBuckets is the number of buckets of which parts writes or deletes
// something.
func changedBuckets(parts fold.Parts) int {
	changed := map[int64]bool{}
	for _, b := range parts.Buckets {
		changed[b.Bucket] = true
	}
	return len(changed)
}

func TestRestorePartsMissingBucket(t *testing.T) {
	p := mustCompile(t, fuzzSpec)
	_, err := p.RestoreParts(&keyfoldv1.KeyState{Seq: 1, SeenBuckets: []int64{3}}, func(int64, int) ([]byte, error) {
		return nil, nil
	})
	if err == nil {
		t.Fatal("a missing bucket restored")
	}
	injected := errors.New("injected")
	_, err = p.RestoreParts(&keyfoldv1.KeyState{Seq: 1, SeenBuckets: []int64{3}}, func(int64, int) ([]byte, error) {
		return nil, injected
	})
	if !errors.Is(err, injected) {
		t.Fatalf("failed load: %v", err)
	}
}

func prepare(tb testing.TB, p *fold.Pipeline, raw string) *fold.Event {
	tb.Helper()
	ev, err := p.Prepare([]byte(raw))
	if err != nil {
		tb.Fatal(err)
	}
	return ev
}

func loadFrom(ps *partsStore) func(int64, int) ([]byte, error) {
	return func(b int64, part int) ([]byte, error) {
		return ps.buckets[bucketPart{b, part}], nil // nil: not stored
	}
}

// TestRestoreInlineThenParts: a snapshot with its ids inline is restored,
// the key gets one more event, and the checkpoint that follows stores every
// bucket the core lists, so the next restore works.
func TestRestoreInlineThenParts(t *testing.T) {
	p := mustCompile(t, fuzzSpec)
	var s fold.State
	for i := range 50 {
		p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":"e%d"}`, i)), int64(i*50))
	}
	old := stateProto(p, &s) // the pre-change snapshot form
	ps := &partsStore{core: old, buckets: map[bucketPart][]byte{}}
	r, err := p.RestoreParts(old, loadFrom(ps))
	if err != nil {
		t.Fatal(err)
	}
	stored := uint64(fold.RestoredVersion)
	p.Apply(&r, prepare(t, p, `{"user_id":"a","event_id":"new"}`), 2500)
	parts, err := p.SnapshotParts(&r, stored)
	if err != nil {
		t.Fatal(err)
	}
	ps.store(parts)
	t.Logf("core lists %v, buckets written %d", mustCore(t, parts).SeenBuckets, len(parts.Buckets))
	if _, err := p.RestoreParts(ps.core, loadFrom(ps)); err != nil {
		t.Fatalf("restore after upgrade: %v", err)
	}
}

// TestRestoreAfterDedupWindowChange: with another dedup_window the bucket
// width changes; the first checkpoint after the restore rewrites the whole
// layout and deletes the old buckets, so nothing is lost or left behind.
func TestRestoreAfterDedupWindowChange(t *testing.T) {
	for _, w2 := range []time.Duration{6 * time.Second, 1500 * time.Millisecond, 3*time.Second + 100*time.Millisecond} {
		t.Run(w2.String(), func(t *testing.T) {
			p1 := mustCompile(t, fuzzSpec)
			spec := fuzzSpec
			spec.DedupWindow = w2
			p2 := mustCompile(t, spec)
			var s fold.State
			ps := &partsStore{buckets: map[bucketPart][]byte{}}
			for i := range 50 {
				p1.Apply(&s, prepare(t, p1, fmt.Sprintf(`{"user_id":"a","event_id":"e%d"}`, i)), int64(i*50))
			}
			parts, _ := p1.SnapshotParts(&s, 0)
			ps.store(parts)
			r, err := p2.RestoreParts(ps.core, loadFrom(ps))
			if err != nil {
				t.Fatal(err)
			}
			p2.Apply(&r, prepare(t, p2, `{"user_id":"a","event_id":"new"}`), 2500)
			parts, _ = p2.SnapshotParts(&r, fold.RestoredVersion)
			ps.store(parts)
			r2, err := p2.RestoreParts(ps.core, loadFrom(ps))
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if !reflect.DeepEqual(stateProto(p2, &r2), stateProto(p2, &r)) {
				t.Fatalf("restored differs: %d ids vs %d", len(stateProto(p2, &r2).Seen), len(stateProto(p2, &r).Seen))
			}
			var extra []bucketPart
			for b := range ps.buckets {
				if !slices.Contains(ps.core.SeenBuckets, b.bucket) {
					extra = append(extra, b)
				}
			}
			if len(extra) > 0 {
				t.Errorf("stale buckets in store: %v", extra)
			}
		})
	}
}

// TestEraseRemovesEverything: a tombstone empties the state, the next parts
// delete every stored id bucket, and an id seen before the erase counts
// again after it.
func TestEraseRemovesEverything(t *testing.T) {
	p, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", DedupWindow: time.Hour,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}}})
	if err != nil {
		t.Fatal(err)
	}
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	var s fold.State
	for i := range 50 {
		ev, err := p.Prepare([]byte(fmt.Sprintf(`{"k":"a","id":"e%d","v":1}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		p.Apply(&s, ev, int64(i)*time.Minute.Milliseconds()) // ids spread over many buckets
	}
	parts, err := p.SnapshotParts(&s, 0)
	if err != nil {
		t.Fatal(err)
	}
	ps.store(parts)
	s.Persisted(parts.Version)
	if len(ps.buckets) < 2 {
		t.Fatalf("setup: %d stored buckets, want several", len(ps.buckets))
	}

	if dup := p.Apply(&s, fold.Tombstone("a"), 50*time.Minute.Milliseconds()); dup {
		t.Error("a tombstone counted as a duplicate")
	}
	if !s.Empty() || s.Seq() != 0 {
		t.Fatalf("after Erase: empty=%v seq=%d", s.Empty(), s.Seq())
	}
	parts, err = p.SnapshotParts(&s, parts.Version)
	if err != nil {
		t.Fatal(err)
	}
	ps.store(parts)
	if len(ps.buckets) != 0 || len(mustCore(t, parts).GetSeenBuckets()) != 0 {
		t.Errorf("after Erase %d id buckets remain stored (core lists %v)", len(ps.buckets), mustCore(t, parts).GetSeenBuckets())
	}
	ev, _ := p.Prepare([]byte(`{"k":"a","id":"e3","v":5}`))
	if p.Apply(&s, ev, 51*time.Minute.Milliseconds()) {
		t.Error("an id applied before the erase is still remembered")
	}
	if got := p.Aggregates(&s); fmt.Sprint(got["sum"]) != "5" || s.Seq() != 1 {
		t.Errorf("after erase and one event: %v seq %d", got, s.Seq())
	}
}

// stateProto is p.StateProto for tests: encoding a state in memory cannot
// fail.
func stateProto(p *fold.Pipeline, s *fold.State) *keyfoldv1.KeyState {
	ks, err := p.StateProto(s)
	if err != nil {
		panic(err)
	}
	return ks
}

// TestDedupMemoryBounded: ids arriving for twenty dedup windows leave at
// most a window's worth (plus one bucket) in the state, and in its
// snapshot; duplicates are counted per key and survive a snapshot.
func TestDedupMemoryBounded(t *testing.T) {
	p, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", DedupWindow: 10 * time.Second,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	var s fold.State
	const perSecond = 50
	maxIDs := 0
	for i := range 200 * perSecond { // 200 s: twenty windows
		now := int64(i) * 1000 / perSecond
		ev, err := p.Prepare(fmt.Appendf(nil, `{"k":"a","id":"e%d"}`, i))
		if err != nil {
			t.Fatal(err)
		}
		p.Apply(&s, ev, now)
		if i%7 == 0 { // a retry of a recent event
			ev, _ := p.Prepare(fmt.Appendf(nil, `{"k":"a","id":"e%d"}`, i))
			if !p.Apply(&s, ev, now) {
				t.Fatalf("event %d retried at once was not a duplicate", i)
			}
		}
		maxIDs = max(maxIDs, len(stateProto(p, &s).Seen))
	}
	// A window is 500 ids; ids leave exactly when they expire.
	if limit := 10*perSecond + perSecond; maxIDs > limit {
		t.Errorf("the key remembered up to %d ids, want at most %d (one window)", maxIDs, limit)
	}
	if want := uint64(200*perSecond/7 + 1); s.Duplicates() != want {
		t.Errorf("duplicates = %d, want %d", s.Duplicates(), want)
	}
	r, b := roundTrip(t, p, &s)
	if r.Duplicates() != s.Duplicates() {
		t.Errorf("restored duplicates %d, want %d", r.Duplicates(), s.Duplicates())
	}
	t.Logf("%d events over 20 windows: at most %d ids remembered; snapshot %d bytes", 200*perSecond, maxIDs, len(b))
	fold.Erase(&s)
	if s.Duplicates() != 0 {
		t.Error("Erase kept the duplicate count")
	}
}

// roundTrip marshals a state whole (MarshalState) and restores it; it also
// returns the bytes.
func roundTrip(t *testing.T, p *fold.Pipeline, s *fold.State) (fold.State, []byte) {
	t.Helper()
	b, err := p.MarshalState(s)
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.UnmarshalState(b)
	if err != nil {
		t.Fatal(err)
	}
	return r, b
}

// mustCore is the core state of parts as a message, whichever its form.
func mustCore(t testing.TB, parts fold.Parts) *keyfoldv1.KeyState {
	t.Helper()
	core, err := parts.CoreState()
	if err != nil {
		t.Fatal(err)
	}
	return core
}

// TestFewIDsStayInline: a key remembering a few ids stores them in its core
// record (one read and one write per snapshot, no buckets); once it holds
// more than fold's inlineIDs, its snapshot moves them all to buckets; when every id
// expired, its buckets are deleted and its ids go inline again. A store
// laid out in buckets for a few ids (as before the inline layout) moves
// to the inline one at the key's next snapshot. Every step restores
// exactly.
func TestFewIDsStayInline(t *testing.T) {
	p := mustCompile(t, fold.Spec{Key: "k", ID: "id", DedupWindow: time.Hour,
		Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	var s fold.State
	stored := uint64(0)
	now := int64(0)
	step := func(what string) fold.Parts {
		t.Helper()
		parts, err := p.SnapshotParts(&s, stored)
		if err != nil {
			t.Fatal(err)
		}
		ps.store(parts)
		s.Persisted(parts.Version)
		stored = parts.Version
		if r := ps.restore(t, p); !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
			t.Fatalf("%s: restored state differs:\n got %v\nwant %v", what, stateProto(p, &r), stateProto(p, &s))
		}
		return parts
	}
	width := (time.Hour / 16).Milliseconds() // a bucket's span
	buckets := map[int64]bool{}              // those the ids fall in
	apply := func(id string) {
		now += time.Minute.Milliseconds() // a few ids per bucket
		p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"k":"a","id":%q}`, id)), now)
		buckets[now/width] = true
	}
	for i := range 5 {
		apply(fmt.Sprint("e", i))
		if parts := step("few ids"); len(parts.Buckets) != 0 || len(ps.core.Seen) != i+1 || len(ps.core.SeenBuckets) != 0 {
			t.Fatalf("%d ids: %d buckets written, core holds %d ids and lists %d buckets", i+1, len(parts.Buckets), len(ps.core.Seen), len(ps.core.SeenBuckets))
		}
	}
	for i := 5; i < fold.InlineIDs; i++ { // as many as the core holds: inline still
		apply(fmt.Sprint("e", i))
	}
	if parts := step("inline, full"); len(parts.Buckets) != 0 || len(ps.core.Seen) != fold.InlineIDs || len(ps.core.SeenBuckets) != 0 {
		t.Fatalf("%d ids: %d buckets written, core holds %d ids and lists %d buckets", fold.InlineIDs, len(parts.Buckets), len(ps.core.Seen), len(ps.core.SeenBuckets))
	}
	apply("one more") // spills
	parts := step("spilled")
	if n := len(buckets); len(ps.core.Seen) != 0 || len(ps.core.SeenBuckets) != n || countData(parts) != n || len(ps.buckets) != n {
		t.Fatalf("%d ids within an hour, in %d buckets: core holds %d ids, lists %v; %d buckets written, %d stored", fold.InlineIDs+1, n, len(ps.core.Seen), ps.core.SeenBuckets, countData(parts), len(ps.buckets))
	}
	// Two hours later every id has expired: the buckets go.
	now += 2 * time.Hour.Milliseconds()
	p.Apply(&s, prepare(t, p, `{"k":"a"}`), now)
	step("expired")
	if len(ps.buckets) != 0 || len(ps.core.SeenBuckets) != 0 {
		t.Fatalf("after every id expired: %d buckets stored, core lists %v", len(ps.buckets), ps.core.SeenBuckets)
	}
	apply("late")
	if step("inline again"); len(ps.core.Seen) != 1 || len(ps.buckets) != 0 {
		t.Fatalf("one new id: core holds %d, %d buckets stored", len(ps.core.Seen), len(ps.buckets))
	}

	// The former layout: two ids in buckets.
	old := &partsStore{core: &keyfoldv1.KeyState{Seq: 2, NowMs: now}, buckets: map[bucketPart][]byte{}}
	for _, e := range []*keyfoldv1.SeenID{{Id: "x", AtMs: now - 5*time.Minute.Milliseconds()}, {Id: "y", AtMs: now - 1000}} {
		data, err := proto.Marshal(&keyfoldv1.SeenBucket{Ids: []*keyfoldv1.SeenID{e}})
		if err != nil {
			t.Fatal(err)
		}
		old.buckets[bucketPart{e.AtMs / width, 0}] = data
		old.core.SeenBuckets = append(old.core.SeenBuckets, e.AtMs/width)
	}
	r := old.restore(t, p)
	if p.Apply(&r, prepare(t, p, `{"k":"a","id":"x"}`), now) == false {
		t.Fatal("an id of the former layout was not remembered")
	}
	p.Apply(&r, prepare(t, p, `{"k":"a","id":"z"}`), now)
	parts, err := p.SnapshotParts(&r, fold.RestoredVersion)
	if err != nil {
		t.Fatal(err)
	}
	old.store(parts)
	if len(old.buckets) != 0 || len(old.core.SeenBuckets) != 0 || len(old.core.Seen) != 3 {
		t.Fatalf("former layout after a snapshot: %d buckets stored, core lists %v, holds %d ids", len(old.buckets), old.core.SeenBuckets, len(old.core.Seen))
	}
}

// TestRestoreWholeBucketThenParts: a bucket stored whole before buckets had
// parts (600 ids under the bucket's own name, no part size recorded: 256)
// is restored and the key gets more ids; the checkpoint that follows
// writes the bucket anew in parts of PartIDs, and records their size, and
// the next writes only the part its new ids are numbered into. Each
// restore holds every id once.
func TestRestoreWholeBucketThenParts(t *testing.T) {
	p := dedupPipeline(t, 24*time.Hour)
	now := int64(10 * time.Hour / time.Millisecond)
	width := (24 * time.Hour / 16).Milliseconds()
	b := now / width
	var sb keyfoldv1.SeenBucket
	for i := range 600 {
		sb.Ids = append(sb.Ids, &keyfoldv1.SeenID{Id: fmt.Sprintf("old%d", i), AtMs: b*width + int64(i)})
	}
	data, err := proto.Marshal(&sb)
	if err != nil {
		t.Fatal(err)
	}
	ps := &partsStore{core: &keyfoldv1.KeyState{Seq: 600, NowMs: now, SeenBuckets: []int64{b}}, buckets: map[bucketPart][]byte{{b, 0}: data}}
	s := ps.restore(t, p)
	stored := uint64(fold.RestoredVersion)
	// partsFrom is the parts numbered from the one id from is in to the one
	// id to-1 is in.
	partsFrom := func(from, to int) []int {
		var parts []int
		for part := from / fold.PartIDs; part <= (to-1)/fold.PartIDs; part++ {
			parts = append(parts, part)
		}
		return parts
	}
	// Every part of the 605 ids, then the part(s) ids 605..609 are in.
	for round, want := range [][]int{partsFrom(0, 605), partsFrom(605, 610)} {
		for i := range 5 {
			p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":"new%d-%d"}`, round, i)), now)
		}
		parts, err := p.SnapshotParts(&s, stored)
		if err != nil {
			t.Fatal(err)
		}
		var wrote []int
		for _, bp := range parts.Buckets {
			if bp.Data == nil {
				t.Fatalf("round %d deletes part %d", round, bp.Part)
			}
			wrote = append(wrote, bp.Part)
		}
		if !slices.Equal(wrote, want) {
			t.Fatalf("round %d wrote parts %v, want %v", round, wrote, want)
		}
		ps.store(parts)
		s.Persisted(parts.Version)
		stored = parts.Version
		if got := ps.core.GetSeenPartIds(); got != fold.PartIDs {
			t.Fatalf("core records parts of %d ids, want %d", got, fold.PartIDs)
		}
		r := ps.restore(t, p)
		if !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
			t.Fatalf("round %d: restored state differs", round)
		}
		if n, want := len(stateProto(p, &r).Seen), 605+5*round; n != want {
			t.Fatalf("round %d: %d ids restored, want %d", round, n, want)
		}
		for _, id := range []string{"old0", "old599", fmt.Sprintf("new%d-4", round)} {
			if !p.Apply(&r, prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":%q}`, id)), now) {
				t.Errorf("round %d: %s not remembered", round, id)
			}
		}
	}
}

// TestRestoreLegacyPartSize: a key stored in parts of 256 ids (its core
// lists the parts but not their size, as before seen_part_ids) restores
// every live id; its next snapshot writes its buckets anew in parts of
// PartIDs and deletes the old parts the new layout does not overwrite; the
// store then holds exactly the new layout, which restores the same state.
func TestRestoreLegacyPartSize(t *testing.T) {
	p := dedupPipeline(t, 24*time.Hour)
	width := (24 * time.Hour / 16).Milliseconds()
	b0 := int64(100) // the older bucket: most of its ids expire
	now := (b0+16)*width + 500
	ps := &partsStore{core: &keyfoldv1.KeyState{NowMs: now}, buckets: map[bucketPart][]byte{}}
	n := 0
	for _, b := range []int64{b0, b0 + 16} {
		const ids = 600 // parts 0, 1 and 2 of 256
		for part := range 3 {
			var sb keyfoldv1.SeenBucket
			for i := part * 256; i < min((part+1)*256, ids); i++ {
				sb.Ids = append(sb.Ids, &keyfoldv1.SeenID{Id: fmt.Sprintf("b%d-%d", b, i), AtMs: b*width + int64(i)})
			}
			data, err := proto.Marshal(&sb)
			if err != nil {
				t.Fatal(err)
			}
			ps.buckets[bucketPart{b, part}] = data
		}
		ps.core.SeenBuckets = append(ps.core.SeenBuckets, b)
		ps.core.SeenBucketParts = append(ps.core.SeenBucketParts, 3)
		n += ids
	}
	ps.core.Seq = uint64(n)
	// b0's ids expire by the key's clock up to b0*width+559: 40 are left,
	// all in its old part 2.
	ps.core.NowMs = b0*width + 559 + (24 * time.Hour).Milliseconds()
	s := ps.restore(t, p)
	if got := len(stateProto(p, &s).Seen); got != 640 {
		t.Fatalf("%d ids restored, want 640", got)
	}
	parts, err := p.SnapshotParts(&s, fold.RestoredVersion)
	if err != nil {
		t.Fatal(err)
	}
	ps.store(parts)
	s.Persisted(parts.Version)
	if got := ps.core.GetSeenPartIds(); got != fold.PartIDs {
		t.Fatalf("core records parts of %d ids, want %d", got, fold.PartIDs)
	}
	want := map[bucketPart]bool{}
	for i, b := range ps.core.SeenBuckets {
		for part := range fold.StoredParts(ps.core, i) {
			want[bucketPart{b, part}] = true
		}
	}
	for bp := range ps.buckets {
		if !want[bp] {
			t.Errorf("bucket %d part %d is stored but not listed (an old part left behind)", bp.bucket, bp.part)
		}
	}
	if len(want) != len(ps.buckets) || len(want) != (40+fold.PartIDs-1)/fold.PartIDs+(600+fold.PartIDs-1)/fold.PartIDs {
		t.Errorf("%d parts listed, %d stored", len(want), len(ps.buckets))
	}
	r := ps.restore(t, p)
	if !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
		t.Fatal("restored state differs")
	}
	for _, id := range []string{fmt.Sprintf("b%d-560", b0), fmt.Sprintf("b%d-599", b0), fmt.Sprintf("b%d-0", b0+16)} {
		if !p.Apply(&r, idEv(t, p, id), ps.core.NowMs) {
			t.Errorf("%s not remembered", id)
		}
	}
	if p.Apply(&r, idEv(t, p, fmt.Sprintf("b%d-559", b0)), ps.core.NowMs) {
		t.Errorf("an expired id is remembered")
	}
}

func idEv(t testing.TB, p *fold.Pipeline, id string) *fold.Event {
	return prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":%q}`, id))
}

// dedupPipeline is the fuzz pipeline with a dedup window of w and no
// windows (no watermark in these tests: windows would pile up).
func dedupPipeline(tb testing.TB, w time.Duration) *fold.Pipeline {
	spec := fuzzSpec
	spec.DedupWindow = w
	spec.Windows = nil
	return mustCompile(tb, spec)
}

// The tests below were written by an independent review of id bucket
// parts (it found that part 0 could be written as a deletion, after which
// the key could not be restored).

// A restore under a changed dedup window (a new bucket layout, written
// whole), then an event that expires 256 ids or more of the oldest new
// bucket: the snapshot that follows restores, and remembers the rest.
func TestPartsRewriteThenExpiry(t *testing.T) {
	p1, p2 := dedupPipeline(t, 16*time.Second), dedupPipeline(t, 8*time.Second)
	var s fold.State
	for i := range 1000 {
		p1.Apply(&s, idEv(t, p1, fmt.Sprint("e", i)), int64(i))
	}
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	parts, _ := p1.SnapshotParts(&s, 0)
	ps.store(parts)
	r := ps.restore(t, p2) // rewrite
	p2.Apply(&r, idEv(t, p2, "new"), 8300)
	parts, _ = p2.SnapshotParts(&r, fold.RestoredVersion)
	for _, b := range parts.Buckets {
		t.Logf("bucket %d part %d data %d bytes", b.Bucket, b.Part, len(b.Data))
	}
	ps.store(parts)
	t.Logf("core lists %v parts %v", ps.core.SeenBuckets, ps.core.SeenBucketParts)
	r2, err := p2.RestoreParts(ps.core, loadFrom(ps))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if !reflect.DeepEqual(stateProto(p2, &r2), stateProto(p2, &r)) {
		t.Fatal("differs")
	}
	for i := 301; i < 1000; i++ {
		if !p2.Apply(&r2, idEv(t, p2, fmt.Sprint("e", i)), 8300) {
			t.Fatalf("e%d not a duplicate", i)
		}
	}
}

// Checkpoints fail while a bucket's first 256 ids expire: the snapshot
// that finally stores restores.
func TestPartsFailuresAcrossExpiry(t *testing.T) {
	p := dedupPipeline(t, 16*time.Second)
	var s fold.State
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	for i := range 100 {
		p.Apply(&s, idEv(t, p, fmt.Sprint("e", i)), int64(i))
	}
	parts, _ := p.SnapshotParts(&s, 0)
	ps.store(parts)
	s.Persisted(parts.Version)
	stored := parts.Version
	for i := 100; i < 900; i++ {
		p.Apply(&s, idEv(t, p, fmt.Sprint("e", i)), int64(i))
		if i%100 == 0 {
			p.SnapshotParts(&s, stored) // failed checkpoint
		}
	}
	p.Apply(&s, idEv(t, p, "late"), 16000+400)
	parts, _ = p.SnapshotParts(&s, stored)
	ps.store(parts)
	s.Persisted(parts.Version)
	if _, err := p.RestoreParts(ps.core, loadFrom(ps)); err != nil {
		t.Fatalf("restore: %v", err)
	}
}

// A random walk over id bucket parts (buckets of about 500 ids): failed
// checkpoints, passivations, dedup window changes, erases, time gaps,
// spills of the changed state. After every stored snapshot the restored
// state equals the one in memory, and every stored part is one the core
// lists.
func TestPartsRandomWalk(t *testing.T) {
	pipes := []*fold.Pipeline{dedupPipeline(t, 4*time.Second), dedupPipeline(t, 3*time.Second), dedupPipeline(t, 5*time.Second)}
	seeds := uint64(24) // (60 were run when it was written)
	if raceDetector {
		seeds = 6
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			spills := rand.New(rand.NewPCG(seed, 11)) // (the walk as it was, and spills)
			forms := rand.New(rand.NewPCG(seed, 13))  // parts packed or not, mixed (a store upgraded)
			p := pipes[0]
			var s fold.State
			ps := &partsStore{buckets: map[bucketPart][]byte{}}
			stored := uint64(0)
			now := int64(0)
			next := 0
			multiSeen, rewrites, cached, spilled := 0, 0, 0, 0
			var unstored []byte // the state spilled, not changed since
			defer func() {
				t.Logf("multi %d rewrites %d cached in buckets %d spilled changed %d", multiSeen, rewrites, cached, spilled)
			}()
			for i := range 30000 {
				now += rng.Int64N(2)
				if rng.IntN(300) == 0 {
					now += rng.Int64N(8000)
				}
				var id string
				if rng.IntN(4) == 0 && next > 0 {
					id = fmt.Sprint("e", next-1-rng.IntN(min(next, 3000)))
				} else {
					id = fmt.Sprint("e", next)
					next++
				}
				ev := idEv(t, p, id)
				if rng.IntN(3000) == 0 {
					ev = fold.Tombstone("a")
				}
				p.Apply(&s, ev, now)
				unstored = nil
				if spills.IntN(100) == 0 {
					// Spilled as it is, changed maybe (actors/spill.go),
					// and back: the walk goes on from the decoded state.
					data, err := p.AppendSpilled(nil, &s)
					if err != nil {
						t.Fatalf("event %d: spill: %v", i, err)
					}
					r := unpackedAs(t, p, data, &s, fmt.Sprintf("event %d: spilled", i))
					if !s.Packable() {
						spilled++
					}
					s, stored, unstored = r, min(r.Version(), fold.RestoredVersion), data
				}
				if rng.IntN(40) != 0 {
					continue
				}
				parts, err := p.Snapshot(&s, stored, nil, fold.SnapshotOptions{PackedParts: forms.IntN(2) == 0})
				if err != nil {
					t.Fatal(err)
				}
				if rng.IntN(3) == 0 {
					continue // failed
				}
				ps.store(parts)
				s.Persisted(parts.Version)
				stored = parts.Version
				if s.Empty() {
					ps.core = nil
				}
				if unstored != nil {
					// The spilled state is stored now: the snapshot cache's
					// form of it (actors/spill.go, retiring the spill) is the
					// state, with nothing to write.
					data, err := fold.StoredCached(nil, unstored)
					if err != nil {
						t.Fatalf("event %d: cache a stored spilled state: %v", i, err)
					}
					c := unpackedAs(t, p, data, &s, fmt.Sprintf("event %d: stored spilled", i))
					again, err := p.SnapshotParts(&c, fold.RestoredVersion)
					if err != nil {
						t.Fatal(err)
					}
					for _, b := range again.Buckets {
						if b.Data != nil {
							t.Fatalf("event %d: stored spilled state writes bucket %d part %d", i, b.Bucket, b.Part)
						}
					}
				}
				// garbage: every stored part is listed
				listed := map[int64]int{}
				for bi, b := range ps.core.GetSeenBuckets() {
					n := 1
					if bi < len(ps.core.GetSeenBucketParts()) && ps.core.SeenBucketParts[bi] > 1 {
						n = int(ps.core.SeenBucketParts[bi])
					}
					listed[b] = n
				}
				for bp := range ps.buckets {
					if n, ok := listed[bp.bucket]; !ok || bp.part >= n {
						t.Fatalf("event %d: stored part %v not listed (core %v %v)", i, bp, ps.core.GetSeenBuckets(), ps.core.GetSeenBucketParts())
					}
				}
				if len(ps.core.GetSeenBucketParts()) > 0 {
					multiSeen++
				}
				r, err := p.RestoreParts(ps.core, loadFrom(ps))
				if err != nil {
					t.Fatalf("event %d: restore: %v", i, err)
				}
				if !s.Empty() && !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
					t.Fatalf("event %d: restored differs:\n%v\n%v", i, stateProto(p, &r), stateProto(p, &s))
				}
				if rng.IntN(3) == 0 { // passivation, maybe under a new window
					switch rng.IntN(3) {
					case 0:
						p = pipes[rng.IntN(len(pipes))]
						rewrites++
						r, err = p.RestoreParts(ps.core, loadFrom(ps))
						if err != nil {
							t.Fatalf("event %d: restore under new window: %v", i, err)
						}
					case 1:
						// Back from the snapshot cache instead: the walk goes
						// on from it, every later snapshot checked as above.
						data, err := p.AppendCached(nil, &s)
						if err != nil {
							t.Fatalf("event %d: cache a clean state: %v", i, err)
						}
						if r, err = p.UnpackCached(data); err != nil {
							t.Fatalf("event %d: decode a cached state: %v", i, err)
						}
						if !s.OnePart() {
							cached++
						}
					}
					s, stored = r, min(r.Version(), fold.RestoredVersion)
					if rng.IntN(2) == 0 {
						now += rng.Int64N(5000) // it comes back later
					}
				}
			}
		})
	}
}

// unpackedAs decodes data (UnpackCached) and fails the test unless it is
// the state want; what names it in a failure.
func unpackedAs(t *testing.T, p *fold.Pipeline, data []byte, want *fold.State, what string) fold.State {
	t.Helper()
	r, err := p.UnpackCached(data)
	if err != nil {
		t.Fatalf("%s: decode: %v", what, err)
	}
	if !reflect.DeepEqual(stateProto(p, &r), stateProto(p, want)) {
		t.Fatalf("%s state differs:\n%v\n%v", what, stateProto(p, &r), stateProto(p, want))
	}
	return r
}

// A clean key with ids in buckets of a pipeline with windows (its cached
// form is its KeyState after the buckets' table, not the positional
// packing) comes back from the cache's form as it was: the same state,
// nothing of it to write, and the same answers to old and new ids.
func TestCachedStateWithWindows(t *testing.T) {
	p := mustCompile(t, fuzzSpec) // windows; dedup window 3 s
	var s fold.State
	now := int64(1_000_000)
	for i := range 3 * fold.PartIDs {
		now += 5
		p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":"e%d","ts":%d,"amount":%d}`, i, now, i)), now)
	}
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	parts, err := p.SnapshotParts(&s, 0)
	if err != nil {
		t.Fatal(err)
	}
	ps.store(parts)
	s.Persisted(parts.Version)
	if len(ps.core.GetSeenBuckets()) == 0 {
		t.Fatal("the ids are inline: the test needs buckets")
	}
	data, err := p.AppendCached(nil, &s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.UnpackCached(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stateProto(p, &c), stateProto(p, &s)) {
		t.Fatal("the cached state differs")
	}
	again, err := p.SnapshotParts(&c, fold.RestoredVersion)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Buckets) != 0 {
		t.Fatalf("the cached state writes %d bucket parts, want none (all stored)", len(again.Buckets))
	}
	for _, id := range []string{"e0", fmt.Sprint("e", 3*fold.PartIDs-1), "new"} {
		ev := prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":%q,"ts":%d}`, id, now))
		if d1, d2 := p.Apply(&s, ev, now), p.Apply(&c, ev, now); d1 != d2 {
			t.Fatalf("%s: duplicate %v in memory, %v from the cache", id, d1, d2)
		}
	}
	// What each stores next (over the same stored snapshot) restores as
	// it is.
	base := ps.clone()
	for _, x := range []struct {
		st    *fold.State
		since uint64
	}{{&s, parts.Version}, {&c, fold.RestoredVersion}} {
		ps := base.clone()
		next, err := p.SnapshotParts(x.st, x.since)
		if err != nil {
			t.Fatal(err)
		}
		ps.store(next)
		if r := ps.restore(t, p); !reflect.DeepEqual(stateProto(p, &r), stateProto(p, x.st)) {
			t.Fatal("a restore of what was stored next differs")
		}
	}
}

func (ps *partsStore) clone() *partsStore {
	return &partsStore{core: proto.Clone(ps.core).(*keyfoldv1.KeyState), buckets: maps.Clone(ps.buckets)}
}
