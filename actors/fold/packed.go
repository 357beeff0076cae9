package fold

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// The packed form of a key's state: what the host keeps in memory of a key
// that left memory (actors/cache.go), and what a store that allows it
// holds as the key's snapshot (actors/packed.go). It is positional
// (aggregates by their index in the pipeline, not by name and op as a
// KeyState holds them): it decodes as it is only with a pipeline of the
// same shape (shape.go), and by name through the shape otherwise
// (UnpackShaped). For the state of a pipeline with aggregates only (no
// windows, patterns, handler, join or sketches), it takes a third of the
// KeyState's bytes (55 B instead of 162 for examples/bench.yaml's five
// aggregates and two ids) and decodes without allocating messages; any
// other state is packed as its KeyState.
//
// It is a stored format, version PackedVersion: stored states must read
// the same in every later build. TestPackedFormatIsPinned holds the bytes;
// a change to them is a new version, which the reader must tell apart.
//
//	packedEntries seq dups now, then per aggregate: count [number last],
//	            then ids: n, then per id its entry as the key's log keeps
//	            it (appendIDEntry: its time from the previous id's, the
//	            first's from now, and the id or its fingerprint), since
//	            version 4
//	packedIDs   the same, each entry's time difference in ms whatever it
//	            is (version 3); read, no longer written
//	packedCore  the same but for the ids: per id: len id now-at, where an
//	            id the store's id index holds may be its fingerprint: len
//	            0, then its 4 bytes (little-endian) (version 2; version 1
//	            has none); read, no longer written
//	packedProto a keyfold.v1.KeyState (AppendState)
//
// Integers are varints (signed ones zigzag); a number is an uvarint whose
// low bit is 0 for an integer (the zigzag of it above that bit, exactly
// representable: |n| < 2^53, not -0) and 1 for a float64 in the 8 bytes
// that follow (little-endian bits).
const (
	packedCore    = 1
	packedProto   = 2
	packedIDs     = 5 // (3 and 4 are the snapshot cache's, cached.go)
	packedEntries = 6
)

// positional reports whether a packed state of form f holds its aggregates
// by position (every form but packedProto).
func positional(f byte) bool { return f == packedCore || f == packedIDs || f == packedEntries }

// PackedVersion is the version of the packed form described above, which
// stored packed snapshots carry: a build that knows an older one refuses
// the states of this one rather than misreading them.
const PackedVersion = 4

// MinPackedVersion is the oldest version of the packed form this build
// reads: version 2 added fingerprints, which version 1 states lack,
// version 3 the ids as entries (packedIDs), and version 4 entries whose
// times may be whole seconds (packedEntries).
const MinPackedVersion = 1

// maxPackedInt bounds the integers a number packs as: beyond it a float64
// no longer represents every integer.
const maxPackedInt = 1 << 53

// AppendPacked appends s in its packed form to dst, the ids the store's
// id index holds as their fingerprints. The state must be one part
// (OnePart): unpacked, a state whose snapshot keeps its ids in buckets
// would not know to delete them.
func (p *Pipeline) AppendPacked(dst []byte, s *State) ([]byte, error) {
	if !s.OnePart() {
		return nil, errors.New("fold: pack state: its ids are in buckets")
	}
	return p.appendPacked(dst, s, int(s.ids.indexed))
}

// appendPacked is AppendPacked of any state, its ids inline, those held in
// full before log offset fpBefore as their fingerprints.
func (p *Pipeline) appendPacked(dst []byte, s *State, fpBefore int) ([]byte, error) {
	if !p.packsCore() {
		return p.appendState(append(dst, packedProto), s, fpBefore)
	}
	dst = append(dst, packedEntries)
	dst = binary.AppendUvarint(dst, s.seq)
	dst = binary.AppendUvarint(dst, s.dups)
	dst = binary.AppendVarint(dst, s.now)
	a := &s.aggs
	for i, op := range p.ops {
		count := a.count(i)
		if count == 0 {
			dst = append(dst, 0) // count 0: empty, as it restores
			continue
		}
		dst = binary.AppendUvarint(dst, count)
		dst = appendPackedNumber(dst, a.numOf(op, i))
		last := a.lastOf(op, i)
		dst = binary.AppendUvarint(dst, uint64(len(last)))
		dst = append(dst, last...)
	}
	dst = binary.AppendUvarint(dst, uint64(s.ids.len()))
	c := s.ids.cursor()
	return appendIDEntries(dst, &c, s.ids.len(), s.now, fpBefore), nil
}

// Packable reports whether s, newer than its stored snapshot, may be
// packed (AppendPacked) and unpacked before that snapshot is written: it is
// one part, and no stored id bucket waits to be deleted (unpacked, a state
// forgets what its snapshot must delete). Any other state keeps that in
// the spill's own form (AppendSpilled, actors/spill.go).
func (s *State) Packable() bool { return s.OnePart() && len(s.ids.gone) == 0 }

// packsCore reports whether the pipeline's states pack positionally: only
// aggregates, none of them a sketch.
func (p *Pipeline) packsCore() bool {
	if p.Timed() {
		return false
	}
	for i := range p.aggs {
		if !packsOp(p.aggs[i].op) {
			return false
		}
	}
	return true
}

// packsOp reports whether an aggregate of op packs positionally (count,
// number, last value); the sketches do not.
func packsOp(op Op) bool { return op >= OpCount && op <= OpLast }

func appendPackedNumber(b []byte, f float64) []byte {
	if n := int64(f); n > -maxPackedInt && n < maxPackedInt && math.Float64bits(float64(n)) == math.Float64bits(f) {
		return binary.AppendUvarint(b, uint64((n<<1)^(n>>63))<<1)
	}
	return binary.LittleEndian.AppendUint64(append(b, 1), math.Float64bits(f))
}

// UnpackState decodes a state AppendPacked encoded with this pipeline, to
// the state a snapshot of it restores (RestoreParts): at RestoredVersion,
// its ids expired by its clock dropped. The state keeps nothing of data.
func (p *Pipeline) UnpackState(data []byte) (State, error) { return p.unpackState(data, true) }

// unpackState is UnpackState; byCopy, it copies ids whose entries the
// log can take as they are (copyIDs), else it adds each one (a test
// compares the two).
func (p *Pipeline) unpackState(data []byte, byCopy bool) (State, error) {
	if len(data) == 0 {
		return State{}, errors.New("fold: packed state: empty")
	}
	switch {
	case data[0] == packedProto:
		var ks keyfoldv1.KeyState
		if err := proto.Unmarshal(data[1:], &ks); err != nil {
			return State{}, fmt.Errorf("fold: packed state: %w", err)
		}
		return p.RestoreParts(&ks, func(b int64, _ int) ([]byte, error) {
			return nil, fmt.Errorf("fold: packed state names id bucket %d", b)
		})
	case !positional(data[0]):
		return State{}, fmt.Errorf("fold: packed state: unknown form %d", data[0])
	case !p.packsCore():
		return State{}, errors.New("fold: packed state: positional, but the pipeline's states do not pack so")
	}
	// The state's variable parts take two allocations, whatever their
	// number: the aggregates with their last values (aggSet), the ids'
	// log. Every object a key holds is one more for each GC cycle to
	// walk, and at a million keys that walk is what an event costs most
	// beyond ten thousand keys (BENCHMARKS.md, sessions 15 and 57). (data is not kept: it is
	// the snapshot cache's copy, and holds the ids' bytes once more.)
	r := packedReader{b: data[1:]}
	s := State{seq: r.uvarint(), dups: r.uvarint(), now: r.varint(), version: RestoredVersion}
	aggs := r // read twice: for the last values' length, then the values
	total := 0
	for range p.ops {
		if r.uvarint() > 0 {
			r.number()
			total += len(r.bytes(r.uvarint()))
		}
	}
	s.aggs = makeAggSet(len(p.ops), total)
	for i := range p.ops {
		if count := aggs.uvarint(); count > 0 {
			s.aggs.restore(p.ops, i, count, aggs.number(), aggs.bytes(aggs.uvarint()))
		}
	}
	n := r.uvarint()
	if n > uint64(len(r.b)) { // each id takes two bytes at least
		return State{}, errors.New("fold: packed state: too many ids")
	}
	horizon := s.now - p.dedupWindow.Milliseconds()
	if byCopy && n > 0 && data[0] == packedEntries && p.copyIDs(&s, &r, n, horizon) {
		n = 0 // (copied)
	}
	if n > 0 {
		// One allocation for the ids: their log takes about what they
		// take packed (the length, the bytes, a time).
		s.ids.log = make([]byte, 0, len(r.b))
	}
	prev := s.now
	for range n {
		id, fp, at := r.idOf(data[0], prev, s.now)
		prev = at
		if r.err == nil && at > horizon { // as loadIDs
			if fp != 0 {
				s.ids.addFingerprint(fp, at, p.bucketWidth())
			} else {
				s.ids.addBytes(id, at, p.bucketWidth())
			}
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return State{}, fmt.Errorf("fold: packed state: %w", r.err)
	}
	return s, nil
}

// copyIDs gives s, unpacked from form packedEntries with no ids yet, the
// n ids that follow in r by copying their entries into its log, the
// expired ones (not after horizon) left out: the packed form's entries
// are the log's own (appendIDEntries), and adding them one by one,
// decoded and encoded again, was most of what unpacking a key cost once
// keys remembered a few dozen ids (BENCHMARKS.md, session 48). It walks
// the entries once, checking each as UnpackState does, writes the first
// id kept as addID would, and copies the entries after it if the ids kept
// are a run of entries (only a prefix expired: ids are added in time
// order) and no difference between two of them is one the log would
// clamp (idTimeDelta): then the log is the one adding them would have
// written (byte for byte, from entries written by appendIDEntry).
// Otherwise, or if an entry is bad, it reports false and leaves s and r
// as they were, for UnpackState to add the ids one by one (or report the
// problem).
func (p *Pipeline) copyIDs(s *State, r *packedReader, n uint64, horizon int64) bool {
	w := *r
	prev, rest, kept, fps := s.now, -1, 0, false
	// lead: the ids kept so far are fingerprints; leadEnd: where in r the
	// last of them ends.
	lead, leadEnd := true, 0
	var first []byte // the first id kept (none: a fingerprint's)
	var firstFP uint32
	var firstAt int64
	for range n {
		before := prev
		id, fp, at := w.entry(prev, false)
		prev = at
		switch {
		case w.err != nil:
			return false
		case rest < 0 && at <= horizon: // as UnpackState's
			continue
		case rest < 0: // the first kept, which the log begins anew (as addID)
			rest, first, firstFP, firstAt = len(r.b)-len(w.b), id, fp, at
		case at <= horizon || idTimeDelta(at, before) != at-before:
			return false
		}
		kept++
		fps = fps || fp != 0
		if lead = lead && fp != 0; lead {
			leadEnd = len(r.b) - len(w.b)
		}
	}
	if kept > 0 {
		d := &s.ids
		// One allocation, of the capacity UnpackState gives the log: the
		// first entry's time is 0 from the log's base, no longer than it
		// was from the previous id's.
		d.log = appendIDEntry(make([]byte, 0, len(r.b)), 0, first, firstFP)
		if firstFP != 0 { // the leading fingerprints' end, as addID sets it
			d.indexed = int32(len(d.log) + leadEnd - rest)
		}
		d.log = append(d.log, r.b[rest:len(r.b)-len(w.b)]...)
		d.n, d.baseAt, d.headAt, d.lastAt, d.fps = int32(kept), firstAt, firstAt, prev, fps
		if kept > inlineIDs { // as addID does on the way
			d.toBuckets(p.bucketWidth())
		}
	}
	r.b = w.b
	return true
}

// packedReader reads a packed state; the first problem sticks in err, and
// reads after it return zeros.
type packedReader struct {
	b   []byte
	err error
}

var errPackedShort = errors.New("truncated")

func (r *packedReader) uvarint() uint64 { return readVarint(r, binary.Uvarint) }
func (r *packedReader) varint() int64   { return readVarint(r, binary.Varint) }

// readVarint reads one varint with decode (binary.Uvarint or Varint).
func readVarint[T uint64 | int64](r *packedReader, decode func([]byte) (T, int)) T {
	if r.err != nil {
		return 0
	}
	v, n := decode(r.b)
	if n <= 0 {
		r.err, r.b = errPackedShort, nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *packedReader) number() float64 {
	v := r.uvarint()
	if v&1 == 0 {
		return float64(unzigzag(v >> 1))
	}
	if v != 1 && r.err == nil {
		r.err, r.b = errors.New("bad number"), nil
	}
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.err, r.b = errPackedShort, nil
		return 0
	}
	f := math.Float64frombits(binary.LittleEndian.Uint64(r.b))
	r.b = r.b[8:]
	return f
}

// idOf reads the next id of a state of form (packedCore, packedIDs or
// packedEntries) whose time is now, after an id of time prev (the first:
// after now): the id, or its fingerprint (not 0), and its time.
func (r *packedReader) idOf(form byte, prev, now int64) (id []byte, fp uint32, at int64) {
	switch form {
	case packedEntries:
		return r.entry(prev, false)
	case packedIDs:
		return r.entry(prev, true)
	}
	if l := r.uvarint(); l > 0 {
		id = r.bytes(l)
	} else {
		fp = r.fingerprint()
	}
	return id, fp, now - r.varint() // (version 2: each from now)
}

// entry reads an id's entry (appendIDEntry), its time from prev. With v3,
// an entry of the packed form's version 3 or a stored part's packed form's
// version 1: as appendIDEntry's but for the header, the zigzag of the
// time difference in ms shifted left by one, its low bit set for a
// fingerprint.
func (r *packedReader) entry(prev int64, v3 bool) (id []byte, fp uint32, at int64) {
	h := r.uvarint()
	switch {
	case v3:
		at = prev + unzigzag(h>>1)
		h &= 1 // (the fingerprint bit, where entries have it)
	case h&2 != 0 && h>>2 > maxIDDelta/1000:
		r.err, r.b = errors.New("an id's time is out of range"), nil
		return nil, 0, 0
	default:
		at = prev + entryDelta(h)
	}
	if h&1 != 0 {
		return nil, r.fingerprint(), at
	}
	if l := r.uvarint(); l > 0 || r.err != nil {
		return r.bytes(l), 0, at
	}
	r.err, r.b = errors.New("an id is empty"), nil
	return nil, 0, at
}

// fingerprint reads an id's fingerprint (not 0).
func (r *packedReader) fingerprint() (fp uint32) {
	if b := r.bytes(fpLen); b != nil {
		if fp = binary.LittleEndian.Uint32(b); fp == 0 {
			r.err, r.b = errors.New("an id's fingerprint is 0"), nil
		}
	}
	return fp
}

// bytes returns the next n bytes, within r.b (not copied).
func (r *packedReader) bytes(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err, r.b = errPackedShort, nil
		return nil
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
}
