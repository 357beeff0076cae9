package fold

// Edge cases of dedup.go (the id set: its log, index, buckets and their
// snapshots), written by an independent review of it. Each compares with a simple model: the ids
// in the order added with their times, forgotten from the front up to the
// first id still within the horizon (the expiry rule idSet documents).

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// idModel is the id set as a list in the order ids were added.
type idModel struct {
	ids []seenID
}

func (m *idModel) has(id string) bool {
	return slices.ContainsFunc(m.ids, func(e seenID) bool { return e.id == id })
}

func (m *idModel) expire(horizon int64) {
	n := 0
	for n < len(m.ids) && m.ids[n].at <= horizon {
		n++
	}
	m.ids = m.ids[n:]
}

// checkIDSet checks the set's internals against themselves and the model:
// the ids and times in its log, its counts, every slot of its index, and,
// when ids were added in time order, its buckets.
func checkIDSet(t *testing.T, what string, d *idSet, m []seenID, width int64, inOrder bool) {
	t.Helper()
	checkIDs(t, what, d, m, true, width, inOrder)
}

// checkIDs is checkIDSet, against the model m only if model is set (else
// against what the set's log holds).
func checkIDs(t *testing.T, what string, d *idSet, m []seenID, model bool, width int64, inOrder bool) {
	t.Helper()
	type entry struct {
		off, prevAt int64
		id          []byte // the log's
		at          int64
	}
	var live []entry
	for c := d.cursor(); c.more(); {
		off, prevAt := c.off, c.at
		id, at := c.next()
		live = append(live, entry{int64(off), prevAt, id, at})
	}
	if !model {
		m = make([]seenID, len(live))
		for i, e := range live {
			m[i] = seenID{unsafe.String(unsafe.SliceData(e.id), len(e.id)), e.at}
		}
	}
	if len(live) != len(m) {
		t.Fatalf("%s: %d ids in the log, want %d", what, len(live), len(m))
	}
	for i, e := range live {
		if string(e.id) != m[i].id || e.at != m[i].at {
			got := make([]seenID, len(live))
			for i, e := range live {
				got[i] = seenID{string(e.id), e.at}
			}
			t.Fatalf("%s: ids %v, want %v", what, abbrev(got), abbrev(m))
		}
	}
	if d.len() != len(m) {
		t.Fatalf("%s: len %d, want %d", what, d.len(), len(m))
	}
	if len(m) > 0 && d.lastAt != m[len(m)-1].at {
		t.Fatalf("%s: lastAt %d, want %d", what, d.lastAt, m[len(m)-1].at)
	}
	for _, e := range m {
		if !d.has(e.id) {
			t.Fatalf("%s: lost %.20q", what, e.id)
		}
	}
	if len(m) == 0 && (len(d.log) > 0 || d.index != nil || d.buckets != nil || d.spilled) {
		t.Fatalf("%s: empty, but log %d bytes, index %v, %d buckets, spilled %v", what, len(d.log), d.index != nil, len(d.buckets), d.spilled)
	}
	if len(m) > int(scanIDs) && d.index == nil {
		t.Fatalf("%s: %d ids and no index", what, len(m))
	}
	if len(m) > inlineIDs && !d.spilled {
		t.Fatalf("%s: %d ids and not spilled", what, len(m))
	}
	if x := d.index; x != nil {
		size := len(x.slots)
		if size < 16 || size&(size-1) != 0 {
			t.Fatalf("%s: index of %d slots", what, size)
		}
		if !x.wide && int(x.dropped)+len(d.log) >= narrowLimit {
			t.Fatalf("%s: narrow slots with offsets up to %d (limit %d)", what, int(x.dropped)+len(d.log), narrowLimit)
		}
		used := 0
		at := map[int64]int{} // live offset → slots pointing at it
		for _, e := range live {
			at[e.off] = 0
		}
		for i, v := range x.slots {
			if v == 0 {
				continue
			}
			used++
			off := v
			if !x.wide {
				off &= 1<<24 - 1
			}
			if off == 0 {
				t.Fatalf("%s: slot %d holds offset+1 = 0 with tag %#x", what, i, v>>24)
			}
			phys := int64(int32(off-1)) - int64(x.dropped)
			if phys < int64(d.head) {
				continue // an expired id's
			}
			n, ok := at[phys]
			if !ok {
				t.Fatalf("%s: slot %d points at %d, not an id's entry (head %d, log %d)", what, i, phys, d.head, len(d.log))
			}
			at[phys] = n + 1
			e, isFP := d.idAt(int32(phys))
			h := maphash.Bytes(idSeed, e)
			if isFP {
				h = fpHash(binary.LittleEndian.Uint32(e))
			}
			if !x.wide && v>>24 != uint32(h>>56) {
				t.Fatalf("%s: slot %d tag %#x, hash's %#x", what, i, v>>24, h>>56)
			}
		}
		for off, n := range at {
			if n != 1 {
				t.Fatalf("%s: %d slots point at the id at %d", what, n, off)
			}
		}
		if used != int(x.used) {
			t.Fatalf("%s: used %d, %d slots not empty", what, x.used, used)
		}
		if 4*used > 3*size {
			t.Fatalf("%s: %d of %d slots used", what, used, size)
		}
	}
	// memSize charges at least the arrays the set holds.
	real := cap(d.log) + cap(d.buckets)*int(unsafe.Sizeof(bucketInfo{}))
	if d.index != nil {
		real += 4 * cap(d.index.slots)
	}
	if d.memSize() < real {
		t.Fatalf("%s: memSize %d, the set holds %d", what, d.memSize(), real)
	}
	if !inOrder || !d.spilled {
		if !d.spilled && len(d.buckets) > 0 {
			t.Fatalf("%s: %d buckets, not spilled", what, len(d.buckets))
		}
		return
	}
	// The buckets: each a run of the log, in bucket order, from start.
	i := 0
	for bi := range d.buckets {
		b := &d.buckets[bi]
		if bi > 0 && d.buckets[bi-1].bucket >= b.bucket {
			t.Fatalf("%s: buckets out of order", what)
		}
		if b.count <= 0 || b.added < b.count || i+b.count > len(live) {
			t.Fatalf("%s: bucket %d: count %d, added %d (%d ids from %d)", what, b.bucket, b.count, b.added, len(live), i)
		}
		if e := live[i]; int64(b.start) != e.off || b.startAt != e.prevAt {
			t.Fatalf("%s: bucket %d starts at %d after %d, its first id at %d after %d", what, b.bucket, b.start, b.startAt, e.off, e.prevAt)
		}
		first := b.added - b.count
		if tn := b.tailNum(); tn >= first {
			if e := live[i+tn-first]; int64(b.tail) != e.off || b.tailAt != e.prevAt {
				t.Fatalf("%s: bucket %d: last part at %d after %d, its id %d at %d after %d", what, b.bucket, b.tail, b.tailAt, tn, e.off, e.prevAt)
			}
		}
		for _, e := range live[i : i+b.count] {
			if e.at/width != b.bucket {
				t.Fatalf("%s: id at %d in the run of bucket %d", what, e.at, b.bucket)
			}
		}
		i += b.count
	}
	if i != len(live) {
		t.Fatalf("%s: the buckets count %d ids, the log holds %d", what, i, len(live))
	}
}

// sameIDs reports whether a and b hold the same ids at the same times, in
// the same order.
func sameIDs(a, b *idSet) bool {
	if a.len() != b.len() {
		return false
	}
	ca, cb := a.cursor(), b.cursor()
	for ca.more() && cb.more() {
		ia, ta := ca.next()
		ib, tb := cb.next()
		if string(ia) != string(ib) || ta != tb {
			return false
		}
	}
	return ca.more() == cb.more()
}

func abbrev(ids []seenID) string {
	var b strings.Builder
	for i, e := range ids {
		if i == 20 {
			fmt.Fprintf(&b, " …(%d)", len(ids))
			break
		}
		id := e.id
		if len(id) > 12 {
			id = fmt.Sprintf("%s…(%d B)", id[:12], len(id))
		}
		fmt.Fprintf(&b, " %q@%d", id, e.at)
	}
	return b.String()
}

// tagTwins returns n ids whose hashes share their top 8 bits (the narrow
// slots' tag) and their low 5 bits (the first slot probed in a table of up
// to 32 slots): in the index each probes where the others sit and matches
// their tag, so only the log tells them apart.
func tagTwins(n int) []string {
	want := maphash.String(idSeed, "twin-0")
	out := []string{"twin-0"}
	for i := 1; len(out) < n; i++ {
		id := fmt.Sprintf("twin-%d", i)
		if h := maphash.String(idSeed, id); h>>56 == want>>56 && h&31 == want&31 {
			out = append(out, id)
		}
	}
	return out
}

// TestIDSetEdges: the set against the model through the edge cases:
// the empty id, ids of 64 KiB, ids with the same tag and first slot, times
// equal, going backwards (in out-of-order seeds) and negative, expiry at
// exactly an id's time (which forgets it) and a millisecond before (which
// does not), everything expiring then ids again, ids coming back after
// they expired (their expired slots still in the index), the log outgrowing
// the narrow slots and coming back under them (small narrowLimit), and
// compactions with the index in place. After every step every invariant of
// the set holds (checkIDSet).
func TestIDSetEdges(t *testing.T) {
	indexAtFirstSearch(t)
	defer func(l int) { narrowLimit = l }(narrowLimit)
	// Sets of a few dozen ids, most of them indexed: the index's edges.
	defer func(n int32) { scanIDs = n }(scanIDs)
	scanIDs = 8
	twins := tagTwins(40)
	long := strings.Repeat("L", 64<<10)
	seeds := uint64(12)
	if raceBuild {
		seeds = 8
	}
	for seed := range seeds {
		inOrder := seed%3 != 2
		narrowLimit = 1<<24 - 1
		if seed%2 == 1 {
			narrowLimit = 4000
		}
		r := rand.New(rand.NewPCG(seed, 99))
		var d idSet
		var m idModel
		const width = 100
		now := int64(1_700_000_000_000)
		if seed%4 == 3 {
			now = -20_000 // times negative, then crossing zero
		}
		var expired []string
		next := 0
		reached := map[string]bool{}
		for step := range 2000 {
			what := fmt.Sprintf("seed %d step %d", seed, step)
			switch op := r.IntN(100); {
			case op < 65:
				var id string
				switch k := r.IntN(40); {
				case k == 0:
					id = "x" // one byte (ids are never empty: Prepare refuses them)
				case k == 1:
					id = long + fmt.Sprint(next) // distinct 64 KiB ids
					next++
				case k < 8:
					id = twins[r.IntN(len(twins))]
				case k < 11 && len(expired) > 0:
					id = expired[r.IntN(len(expired))]
				case k < 16 && len(m.ids) > 0:
					id = m.ids[r.IntN(len(m.ids))].id // held: not added
				default:
					id = fmt.Sprint("id-", next)
					next++
				}
				if got, want := d.has(id), m.has(id); got != want {
					t.Fatalf("%s: has(%.20q) = %v, want %v", what, id, got, want)
				} else if want {
					continue
				}
				switch r.IntN(40) {
				case 0, 1, 2, 3, 4, 5, 6, 7, 8, 9:
					now += int64(r.IntN(60))
				case 10:
					now += int64(r.IntN(3000))
				}
				at := now
				if !inOrder && r.IntN(6) == 0 {
					at -= int64(r.IntN(400)) // backwards
					reached["backwards"] = true
				}
				d.add(id, at, width)
				m.ids = append(m.ids, seenID{id, at})
				if id == "x" {
					reached["short"] = true
				}
				if at < 0 {
					reached["negative"] = true
				}
			case op < 85:
				horizon := now - 1000 - int64(r.IntN(5000))
				if len(m.ids) > 0 && r.IntN(3) == 0 {
					// exactly at an id's time, or just before it
					horizon = m.ids[r.IntN(len(m.ids)/4+1)].at - int64(r.IntN(2))
					reached["boundary"] = true
				}
				before := m.ids
				m.expire(horizon)
				for _, e := range before[:len(before)-len(m.ids)] {
					expired = append(expired, e.id)
				}
				hadIndex, head := d.index != nil, d.head
				d.expire(horizon, width, uint64(step))
				if hadIndex && d.index != nil && d.head < head {
					reached["compacted with index"] = true
				}
			case op < 87:
				now += 1_000_000
				for _, e := range m.ids {
					expired = append(expired, e.id)
				}
				if len(m.ids) > int(scanIDs) {
					reached["all expired"] = true
				}
				m.ids = nil
				d.expire(now, width, uint64(step))
			default:
				if id := fmt.Sprint("absent-", step); d.has(id) {
					t.Fatalf("%s: has %q, never added", what, id)
				}
			}
			if d.index != nil && d.index.wide {
				reached["wide"] = true
			}
			if d.index != nil && !d.index.wide && reached["wide"] {
				reached["narrow again"] = true
			}
			if len(m.ids) > 24 {
				reached["many"] = true
			}
			checkIDSet(t, what, &d, m.ids, width, inOrder)
		}
		for _, want := range []string{"short", "boundary", "compacted with index", "all expired", "many"} {
			if !reached[want] {
				t.Errorf("seed %d: never reached %q", seed, want)
			}
		}
		if seed%2 == 1 && !reached["narrow again"] {
			t.Errorf("seed %d: the slots never went wide and back (%v)", seed, reached)
		}
		if seed%4 == 3 && (!reached["negative"] || now <= 0) {
			t.Errorf("seed %d: times did not cross zero", seed)
		}
		if !inOrder && !reached["backwards"] {
			t.Errorf("seed %d: no time went backwards", seed)
		}
	}
}

// TestIDSetTagTwins: ids whose hashes agree in the tag and the first
// slots probed, many of them expiring and coming back, some re-added
// after they expired while their old slots are still in the index: only
// the ones held are found, each exactly once in the index.
func TestIDSetTagTwins(t *testing.T) {
	twins := tagTwins(30)
	var d idSet
	var m idModel
	now := int64(0)
	for round := range 40 {
		for i, id := range twins {
			if (i+round)%3 == 0 || m.has(id) {
				continue
			}
			now++
			d.add(id, now, 10)
			m.ids = append(m.ids, seenID{id, now})
			checkIDSet(t, fmt.Sprintf("round %d add %d", round, i), &d, m.ids, 10, true)
		}
		for _, id := range twins {
			if d.has(id) != m.has(id) {
				t.Fatalf("round %d: has(%q) = %v", round, id, d.has(id))
			}
		}
		h := now - 12
		m.expire(h)
		d.expire(h, 10, uint64(round))
		checkIDSet(t, fmt.Sprintf("round %d expire", round), &d, m.ids, 10, true)
	}
}

// TestIDSetNarrowLimitExact: the log reaching the narrow slots' real
// limit (2^24 - 1, not the test's) to the byte, around it: every id is
// found after, the slots switch to wide exactly when an offset would no
// longer fit beside the tag, and back once compaction and a rebuild bring
// the log under it.
func TestIDSetNarrowLimitExact(t *testing.T) {
	indexAtFirstSearch(t)
	const bits = 1<<24 - 1 // the most offset + 1 beside an 8-bit tag
	ends := []int{bits - 4, bits - 3, bits - 2, bits - 1, bits, bits + 1, bits + 2}
	if raceBuild {
		ends = ends[2:6]
	}
	for _, end := range ends {
		t.Run(fmt.Sprint(end-bits), func(t *testing.T) {
			var d idSet
			var m idModel
			add := func(id string, at int64) {
				d.add(id, at, 1000)
				m.ids = append(m.ids, seenID{id, at})
			}
			for i := range scanIDs + 1 {
				add(fmt.Sprint("s", i), 1)
			}
			d.has("s0") // indexed, narrow
			// A big id that ends the log at end - 3, then one of 1 byte
			// (3 bytes: delta, length, byte) that ends it at end.
			entry := func(n int) int { return 1 + binary.PutUvarint(make([]byte, 10), uint64(n)) + n }
			n := end - 3 - len(d.log) - 4
			for len(d.log)+entry(n) < end-3 {
				n++
			}
			for len(d.log)+entry(n) > end-3 {
				n--
			}
			add(strings.Repeat("b", n), 1)
			if len(d.log) != end-3 {
				t.Fatalf("log %d, want %d", len(d.log), end-3)
			}
			add("z", 1)
			if len(d.log) != end {
				t.Fatalf("log %d, want %d", len(d.log), end)
			}
			if wantWide := end >= narrowLimit; d.index.wide != wantWide {
				t.Fatalf("log %d bytes: wide %v, want %v", end, d.index.wide, wantWide)
			}
			checkIDSet(t, "at the limit", &d, m.ids, 1000, true)
			add("after", 2)
			checkIDSet(t, "after the limit", &d, m.ids, 1000, true)
			// The big id expires with those before it: compaction.
			d.expire(1, 1000, 1)
			m.expire(1)
			checkIDSet(t, "compacted", &d, m.ids, 1000, true)
			for i := range scanIDs + 1 {
				add(fmt.Sprint("t", i), 3)
			}
			d.has("t0")
			if d.index == nil || d.index.wide {
				t.Fatalf("a small log again: index %+v", d.index)
			}
			checkIDSet(t, "small again", &d, m.ids, 1000, true)
		})
	}
}

// edgePipeline is a pipeline with ids only (a count aggregate), dedup
// window w: its snapshots are the direct encoding's.
func edgePipeline(t *testing.T, w time.Duration) *Pipeline {
	t.Helper()
	p, err := Compile("review", Spec{Key: "k", ID: "id", DedupWindow: w, Aggregates: map[string]AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// partStore is a key's stored snapshot in parts.
type partStore struct {
	core    *keyfoldv1.KeyState
	buckets map[[2]int64][]byte
}

func (ps *partStore) store(t *testing.T, parts Parts) {
	t.Helper()
	core, err := parts.CoreState()
	if err != nil {
		t.Fatal(err)
	}
	ps.core = proto.Clone(core).(*keyfoldv1.KeyState)
	for _, b := range parts.Buckets {
		if b.Data == nil {
			delete(ps.buckets, [2]int64{b.Bucket, int64(b.Part)})
		} else {
			ps.buckets[[2]int64{b.Bucket, int64(b.Part)}] = b.Data
		}
	}
	// Nothing is left in the store that the core does not list.
	for k := range ps.buckets {
		i := slices.Index(ps.core.SeenBuckets, k[0])
		if i < 0 || k[1] >= int64(StoredParts(ps.core, i)) {
			t.Fatalf("bucket %d part %d stored, the core lists buckets %v, parts %v", k[0], k[1], ps.core.SeenBuckets, ps.core.SeenBucketParts)
		}
	}
}

func (ps *partStore) restore(t *testing.T, p *Pipeline) State {
	t.Helper()
	s, err := p.RestoreParts(ps.core, func(b int64, part int) ([]byte, error) {
		return ps.buckets[[2]int64{b, int64(part)}], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestIDSetRestoredContinuesAlike: a key that is checkpointed (in parts,
// some checkpoints failing), restored from its parts or unpacked from its
// packed form, and goes on from the restored state, next to the same key
// never snapshotted: both answer every id alike, and as the model (an id
// is a duplicate while it was applied less than the window ago), hold the
// same ids at the same times, through long ids, bursts of equal times
// (several parts a bucket), silences longer than the window, restores
// while the log has an expired front (head > 0) and, in odd seeds, the
// narrow slots' limit.
func TestIDSetRestoredContinuesAlike(t *testing.T) {
	defer func(l int) { narrowLimit = l }(narrowLimit)
	const window = 1600 // ms: buckets of 100 ms
	p := edgePipeline(t, window*time.Millisecond)
	long := strings.Repeat("x", 64<<10)
	seeds := []uint64{0, 1, 2, 3, 4, 5, 6, 7}
	if raceBuild {
		seeds = []uint64{0, 3}
	}
	reachedHead, reachedWide, reachedMulti, reachedPacked, reachedBack := false, false, false, false, false
	for _, seed := range seeds {
		narrowLimit = 1<<24 - 1
		if seed%2 == 1 {
			narrowLimit = 20_000
		}
		r := rand.New(rand.NewPCG(seed, 5))
		var orig, rest State // never snapshotted; snapshotted and restored
		ps := &partStore{buckets: map[[2]int64][]byte{}}
		stored := uint64(0)
		model := map[string]int64{}
		now := int64(1_700_000_000_000)
		clock := int64(0)   // the key's: the latest processing time applied
		busy := seed%4 == 3 // ids 0-1 ms apart: more than partIDs a bucket
		events := 1500
		if busy {
			events = 4000
			if raceBuild {
				events = 2000
			}
		}
		for i := range events {
			switch {
			case busy && i%300 == 299:
				now += 250 // bursts of about 300 ids in 75 ms: parts
			case busy:
				now += int64(r.IntN(4) / 3)
			case r.IntN(200) == 0:
				now += window + int64(r.IntN(3)) - 1 // about a window: everything (or all but the last) goes
			default:
				now += int64(r.IntN(12))
			}
			var id string
			switch k := r.IntN(500); {
			case k < 2:
				id = long + fmt.Sprint(i)
			case k < 200:
				id = fmt.Sprint("r", r.IntN(i+1)) // often one held, or expired
			default:
				id = fmt.Sprint("u", i)
			}
			ev, err := p.Prepare([]byte(fmt.Sprintf(`{"k":"a","id":%q}`, id)))
			if err != nil {
				t.Fatal(err)
			}
			// Now and then the processing clock steps back: the key's
			// clock stays (ids are remembered in time order).
			nowMs := now
			if r.IntN(15) == 0 {
				nowMs -= int64(r.IntN(300))
				reachedBack = true
			}
			clock = max(clock, nowMs)
			at, ok := model[id]
			want := ok && at > clock-window
			if !want {
				model[id] = clock
			}
			d1, d2 := p.Apply(&orig, ev, nowMs), p.Apply(&rest, ev, nowMs)
			if d1 != want || d2 != want {
				t.Fatalf("seed %d event %d: %q duplicate %v in the original, %v restored, want %v", seed, i, id[:min(len(id), 12)], d1, d2, want)
			}
			if i%2 == 0 && !sameIDs(&orig.ids, &rest.ids) {
				t.Fatalf("seed %d event %d: ids differ:\n original %v\n restored %v", seed, i, abbrev(orig.ids.list()), abbrev(rest.ids.list()))
			}
			if i%(3+orig.ids.len()/20) == 0 {
				checkIDs(t, fmt.Sprintf("seed %d event %d original", seed, i), &orig.ids, nil, false, p.bucketWidth(), true)
				checkIDs(t, fmt.Sprintf("seed %d event %d restored", seed, i), &rest.ids, nil, false, p.bucketWidth(), true)
			}
			reachedWide = reachedWide || rest.ids.index != nil && rest.ids.index.wide
			if r.IntN(8) != 0 {
				continue
			}
			// A checkpoint of the restored copy.
			head := rest.ids.head
			parts, err := p.SnapshotParts(&rest, stored)
			if err != nil {
				t.Fatal(err)
			}
			if r.IntN(6) == 0 {
				continue // failed: nothing stored
			}
			ps.store(t, parts)
			rest.Persisted(parts.Version)
			stored = parts.Version
			reachedMulti = reachedMulti || len(ps.core.SeenBucketParts) > 0
			if r.IntN(3) != 0 {
				continue
			}
			// Passivated and back: from the parts, or (a few ids inline)
			// from the packed form.
			var back State
			if rest.OnePart() && r.IntN(2) == 0 {
				packed, err := p.AppendPacked(nil, &rest)
				if err != nil {
					t.Fatal(err)
				}
				if back, err = p.UnpackState(packed); err != nil {
					t.Fatal(err)
				}
				reachedPacked = true
			} else {
				back = ps.restore(t, p)
				reachedHead = reachedHead || head > 0 && len(ps.core.SeenBuckets) > 0
			}
			if !sameIDs(&back.ids, &rest.ids) {
				t.Fatalf("seed %d event %d: restored ids differ:\n got %v\nwant %v", seed, i, abbrev(back.ids.list()), abbrev(rest.ids.list()))
			}
			checkIDs(t, fmt.Sprintf("seed %d event %d just restored", seed, i), &back.ids, nil, false, p.bucketWidth(), true)
			rest, stored = back, RestoredVersion
		}
	}
	if !reachedHead || !reachedWide || !reachedMulti || !reachedPacked || !reachedBack {
		t.Fatalf("the test did not reach what it is for: snapshot with head > 0 %v, wide slots %v, parts %v, packed %v, clock back %v", reachedHead, reachedWide, reachedMulti, reachedPacked, reachedBack)
	}
}

// TestIDSetExpireAllThenAgain: a set of many ids (indexed, spilled,
// compacted once) all expiring at exactly the horizon lets every array go
// (memSize 0), and the ids added after are inline and found; the same
// after a restore.
func TestIDSetExpireAllThenAgain(t *testing.T) {
	var d idSet
	for i := range 1000 {
		d.add(fmt.Sprint("a", i), int64(i), 10)
	}
	d.expire(599, 10, 1) // compacts
	if d.head != 0 || d.len() != 400 {
		t.Fatalf("head %d, %d ids", d.head, d.len())
	}
	d.expire(989, 10, 2) // 10 left: compacted again, to a log their size
	if live := len(d.log) - int(d.head); d.len() != 10 || cap(d.log) > 2*live {
		t.Fatalf("%d ids of %d bytes in a log of %d (room for %d)", d.len(), live, len(d.log), cap(d.log))
	}
	d.expire(999, 10, 3) // exactly the newest id's time
	if d.len() != 0 || d.memSize() != 0 || d.has("a999") {
		t.Fatalf("all expired: %d ids, memSize %d", d.len(), d.memSize())
	}
	if len(d.gone) != 100 {
		t.Fatalf("%d buckets to delete, want 100", len(d.gone))
	}
	var m idModel
	for i := range 12 {
		id := fmt.Sprint("a", i*91) // ids it held before
		d.add(id, 2000+int64(i), 10)
		m.ids = append(m.ids, seenID{id, 2000 + int64(i)})
		checkIDSet(t, fmt.Sprint("again ", i), &d, m.ids, 10, true)
	}
	// A millisecond before the newest id's time: it stays.
	d.expire(2010, 10, 4)
	m.expire(2010)
	checkIDSet(t, "all but one", &d, m.ids, 10, true)
	if d.len() != 1 || !d.has("a1001") {
		t.Fatalf("%d ids left: %v", d.len(), d.list())
	}
}

// TestIDSetMemSizeFollowsLiveIDs: a key with a 16 s window (buckets of
// 1 s) gets 100,000 ids in one burst, then one id every 800 ms (20 held at
// a time) for as many ids again. What it holds, and memSize charges, comes
// down to the size of 20 ids: the log does (compaction), the index does
// not — an expired id's slot stays until the table is rebuilt on growth,
// and a new id takes an expired id's slot without counting as used, so a
// table of 262,144 slots (1 MiB) stays for 20 ids for about 2.4 times the
// burst's ids more (dedup.go insert and expire).
func TestIDSetMemSizeFollowsLiveIDs(t *testing.T) {
	const width, window, peak = 1000, 16 * 1000, 100_000
	var d idSet
	for i := range peak {
		d.add(fmt.Sprintf("e%08d", i), int64(i)*(window-1)/peak, width)
	}
	atPeak := d.memSize()
	now := int64(window)
	for i := peak; i < 2*peak; i++ {
		now += window / 20
		d.expire(now-window, width, uint64(i))
		d.add(fmt.Sprintf("e%08d", i), now, width)
	}
	if d.len() != 20 {
		t.Fatalf("%d ids", d.len())
	}
	slots := 0
	if d.index != nil {
		slots = len(d.index.slots)
	}
	t.Logf("memSize at %d ids: %d B; with 20 left, %d ids later: %d B (log cap %d, index %d slots, %d buckets' room)", peak, atPeak, peak, d.memSize(), cap(d.log), slots, cap(d.buckets))
	if n := d.memSize(); n > 4096 || slots > 256 {
		t.Errorf("20 ids of 9 bytes: memSize %d B, index of %d slots", n, slots)
	}
}

// TestIDSetIDsAtTheBodyLimit: the edge bounds an event's id only by the
// request body (max_body_bytes, 8 MiB by default; gRPC's message size is
// the same bound): two ids of nearly 8 MiB beside small ones take the log
// past the narrow slots' real limit (16 MiB). The key recognises every id,
// checkpoints in parts, restores, and forgets the big ids in their turn.
func TestIDSetIDsAtTheBodyLimit(t *testing.T) {
	const window = 16_000
	p := edgePipeline(t, window*time.Millisecond)
	big := func(c byte) string { return strings.Repeat(string(c), 8<<20-32) }
	ids := []string{big('a')}
	for i := range int(scanIDs) + 8 { // indexed by the last ones' searches
		ids = append(ids, fmt.Sprint("s", i))
	}
	ids = append(ids, big('b'), "last")
	var s State
	now := int64(1_700_000_000_000)
	events := map[string]*Event{} // prepared once (an event is immutable)
	apply := func(s *State, id string, now int64) bool {
		ev := events[id]
		if ev == nil {
			var err error
			if ev, err = p.Prepare([]byte(fmt.Sprintf(`{"k":"a","id":%q}`, id))); err != nil {
				t.Fatal(err)
			}
			events[id] = ev
		}
		return p.Apply(s, ev, now)
	}
	for i, id := range ids {
		if apply(&s, id, now+int64(i)*100) {
			t.Fatalf("id %d a duplicate", i)
		}
	}
	if s.ids.index == nil || !s.ids.index.wide || len(s.ids.log) < narrowLimit {
		t.Fatalf("log %d bytes, index %+v: not past the narrow slots", len(s.ids.log), s.ids.index != nil)
	}
	checkIDs(t, "big ids", &s.ids, nil, false, p.bucketWidth(), true)
	parts, err := p.SnapshotParts(&s, 0)
	if err != nil {
		t.Fatal(err)
	}
	ps := &partStore{buckets: map[[2]int64][]byte{}}
	ps.store(t, parts)
	s.Persisted(parts.Version)
	r := ps.restore(t, p)
	if !sameIDs(&r.ids, &s.ids) {
		t.Fatalf("restored %v, want %v", abbrev(r.ids.list()), abbrev(s.ids.list()))
	}
	// The first big id and the small ones leave the window (the log is
	// compacted), then the second big one.
	for _, st := range []*State{&s, &r} {
		at := now + window + 2000
		for i, id := range ids {
			want := int64(i)*100 > 2000
			if got := apply(st, id, at); got != want {
				t.Fatalf("at +%d ms: id %d duplicate %v, want %v", at-now, i, got, want)
			}
		}
		checkIDs(t, "after", &st.ids, nil, false, p.bucketWidth(), true)
	}
	if !sameIDs(&r.ids, &s.ids) {
		t.Fatalf("restored %v, original %v", abbrev(r.ids.list()), abbrev(s.ids.list()))
	}
}

// TestIDSetIndexBuiltBySearch: ids are added without an index; the first
// search of a set of more than scanIDs builds it (sized for them all, so
// that the adds after it go on filling it), and a set of scanIDs or
// fewer is searched in its log and never indexed.
func TestIDSetIndexBuiltBySearch(t *testing.T) {
	indexAtFirstSearch(t)
	var d idSet
	var m []seenID
	for i := range int(scanIDs) {
		id := fmt.Sprint("id-", i)
		d.add(id, int64(i), 1000)
		m = append(m, seenID{id, int64(i)})
		if d.has("absent") || !d.has(id) {
			t.Fatalf("%d ids: searched wrong", i+1)
		}
	}
	if d.index != nil {
		t.Fatalf("%d ids, searched: indexed", scanIDs)
	}
	for i := scanIDs; i < 100; i++ {
		id := fmt.Sprint("id-", i)
		d.add(id, int64(i), 1000)
		m = append(m, seenID{id, int64(i)})
	}
	if d.index != nil {
		t.Fatal("100 ids added, none searched: indexed")
	}
	if d.has("absent") {
		t.Fatal("has an id never added")
	}
	x := d.index
	if x == nil || x.used != 100 || len(x.slots) != 256 {
		t.Fatalf("100 ids searched once: index %+v", x)
	}
	checkIDSet(t, "searched", &d, m, 1000, true)
	for i := 100; i < 120; i++ {
		d.add(fmt.Sprint("id-", i), int64(i), 1000)
		m = append(m, seenID{fmt.Sprint("id-", i), int64(i)})
	}
	if len(d.index.slots) != 256 || d.index.used != 120 {
		t.Fatalf("20 more ids: index of %d slots, %d used", len(d.index.slots), d.index.used)
	}
	checkIDSet(t, "added to", &d, m, 1000, true)
}

// indexAtFirstSearch makes the first search of more than scanIDs ids build
// the index, for the test (tests of the index's edges).
func indexAtFirstSearch(t *testing.T) {
	was := indexAfterScans
	indexAfterScans = 0
	t.Cleanup(func() { indexAfterScans = was })
}

// TestIDSetIndexAfterScans: a set of more than scanIDs ids is scanned by
// its first indexAfterScans searches and indexed by the next; one of more
// than maxScanIDs at its first; every search answers right either way.
func TestIDSetIndexAfterScans(t *testing.T) {
	for _, n := range []int{int(scanIDs) + 1, maxScanIDs, maxScanIDs + 1} {
		var d idSet
		for i := range n {
			d.add(fmt.Sprint("id-", i), int64(i), 1000)
		}
		for search := 0; search <= int(indexAfterScans); search++ {
			wantIndex := n > maxScanIDs || search == int(indexAfterScans)
			if !d.has(fmt.Sprint("id-", search)) {
				t.Fatalf("%d ids, search %d: id not found", n, search)
			}
			if (d.index != nil) != wantIndex {
				t.Fatalf("%d ids, after search %d: index %v, want %v", n, search, d.index != nil, wantIndex)
			}
		}
		if d.has("absent") {
			t.Fatalf("%d ids: has an id never added", n)
		}
	}
}
