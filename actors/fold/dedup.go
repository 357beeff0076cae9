package fold

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// idSet remembers the ids a key applied within its pipeline's dedup window.
//
// For snapshots the ids are grouped into buckets by the time they were
// applied (a sixteenth of the window each), so that a checkpoint of a key
// that receives ids all day rewrites the one bucket that changed, not every
// id of the last 24 hours. A bucket is stored in parts of partIDs ids, by
// the order ids were added to it, so that the checkpoint rewrites only the
// last part, not the bucket's whole fill: rewriting the whole bucket made
// each checkpoint of a busy key grow with the bucket's age, 90 minutes of
// ids at a 24h window (at 10k keys and 14 ids a second each, checkpoints
// went from 0.4 to 9 s in two and a half minutes, BENCHMARKS.md session
// 14). A bucket is deleted, every part, when its last id expires; ids that
// expire from a bucket that still holds others stay in its stored parts
// and are dropped again when it is loaded, which gives back exactly the
// same set.
type idSet struct {
	// log holds the ids, oldest first, from head on, as entries
	// (appendIDEntry), each one's time from the previous id's (the first's
	// from baseAt): an id, or for an id the store's id index holds that
	// the key knows only by its fingerprint (restored from a snapshot in a
	// store with an index), the fingerprint. One allocation for every id
	// of the key, about its length and three bytes each: a key in memory
	// is meant to take less than a KiB, an id 32 B, and the collector walks
	// one object per key instead of one per id (as strings, each id was an
	// object of its own and 40 B, BENCHMARKS.md session 16). Expired ids
	// stay before head until they are half the log (compact).
	log    []byte
	head   int32
	n      int32 // the ids from head
	baseAt int64 // the time of the id before head (deltas start there)
	lastAt int64 // the time of the newest id
	// headAt is at most the time of the id at head (0: not known), so that
	// expire knows that nothing expires without reading the log: the head
	// of a key's ids is apart from the newest ones, and reading it was a
	// cache miss per event (4% of the node's CPU at 10k keys, BENCHMARKS.md
	// session 29).
	headAt int64
	// index finds an id among more than scanIDs (a set of a few is
	// searched in the log), built by the first search (has): an
	// open-addressing table, by the id's hash, of its offset + 1 (0: empty) and, while offsets stay below
	// narrowLimit, in the top 8 bits the hash's (so that a probe looks at
	// the log only for a likely match); wide is set when the slots hold
	// offsets alone. The offsets are the log's plus dropped, the bytes
	// compaction dropped since the index was built, so that compaction
	// leaves the index be. An expired id's slot (before head) stays until
	// the table is rebuilt on growth, and probes go past it. used counts
	// the slots not empty. (Behind a pointer: most keys have none.)
	index *idIndex
	// buckets are the buckets holding ids, by bucket number, once the ids
	// spilled out of the core (none while they are inline). There are
	// about 17 at most (a sixteenth of the window each), so a sorted slice
	// is smaller and faster than a map.
	buckets []bucketInfo
	gone    []goneBucket // emptied buckets whose stored copies must go
	// spilled is set once the key held more than inlineIDs ids: from then
	// its snapshots keep the ids in buckets, before inline in the core
	// (see SnapshotParts). It is cleared when no id is left.
	spilled bool
	// scans counts the searches of more than scanIDs ids without an index,
	// up to indexAfterScans.
	scans uint8
	// fps is set once the set holds an id as its fingerprint (cleared when
	// no id is left).
	fps bool
	// indexed is the log offset before which the ids held in full are in
	// the store's id index too; those from it are not (applied since the
	// last snapshot that handed its ids to a checkpoint, or restored in
	// full from a snapshot written without an index). markOff is the
	// log's length as of the last snapshot that handed ids to a
	// checkpoint, the low 32 bits of its version markV, which Persisted
	// turns into indexed. (One mark, in 8 bytes: a key in memory is a
	// grain in the 448-byte size class, actors/grainlayout_test.go. A
	// snapshot stored while a later one is pending only leaves its ids to
	// be handed again.)
	indexed, markOff int32
	markV            uint32
}

// fpLen is the bytes of a fingerprint in the log and the packed form.
const fpLen = 4

// Fingerprint returns what a key keeps of an id that the store's id index
// holds: 32 bits of the id's xxhash64, never 0. Fixed, not seeded per
// process: it is stored with the key's state, and only ever leads to a
// look-up in the index (a collision costs a read, not a wrong answer).
// TestFingerprintIsPinned holds its values: they are a stored format.
func Fingerprint(id string) uint32 {
	return idFingerprint(unsafe.Slice(unsafe.StringData(id), len(id)))
}

func idFingerprint(id []byte) uint32 {
	if fingerprintHook != nil {
		return fingerprintHook(string(id))
	}
	if f := uint32(xxhash.Sum64(id)); f != 0 {
		return f
	}
	return 1
}

// fingerprintHook replaces Fingerprint in tests (SetFingerprintForTest).
var fingerprintHook func(string) uint32

// SetFingerprintForTest makes f the fingerprint of ids (nil: the real
// one), so that a test can make ids collide; it returns what undoes it.
// Not for use outside tests: stored fingerprints must not change.
func SetFingerprintForTest(f func(string) uint32) (undo func()) {
	was := fingerprintHook
	fingerprintHook = f
	return func() { fingerprintHook = was }
}

// fpHash is the index's hash of a fingerprint (an id the set holds only
// so): the fingerprint is a hash already; the multiplication spreads it
// into the top bits the slots keep.
func fpHash(fp uint32) uint64 { return uint64(fp) * 0x9e3779b97f4a7c15 }

// scanIDs is the most ids an idSet searches in its log, without an index.
// The index is built by the first search among more (has), not as ids are
// added: most keys at a million come back into memory for an event or two
// and leave again, and building each one's index as its ids were restored
// (grown twice or three times on the way) was a tenth of the node's CPU
// once keys remembered a few dozen ids (BENCHMARKS.md, session 36). A scan
// of up to 32 ids reads a kilobyte of log in order, about what one probe's
// cache misses cost. (A variable for tests.)
var scanIDs int32 = 32

// indexAfterScans is how many searches of more than scanIDs ids (up to
// maxScanIDs) scan the log before the next builds the index. A key that
// comes back into memory for an event or two (most keys, past a hundred
// thousand) is searched once or twice: building its index for that, a
// hash of every id it remembers, was 7% of the node's CPU once keys
// remembered a few dozen ids (BENCHMARKS.md, session 37); a key searched
// more often gets it after these few scans. (A variable for tests.)
var indexAfterScans uint8 = 4

// maxScanIDs is the most ids a search scans: a set of more is indexed at
// its first search.
const maxScanIDs = 256

// inlineIDs is the most ids a key's snapshot holds inline, in its core
// record: most keys remember a few dozen ids at most, and one record
// instead of a core and a bucket halves the reads of a key coming back
// into memory and the writes of its checkpoints, and is packed (the
// snapshot cache keeps only packed states; BENCHMARKS.md). Beyond it a
// checkpoint rewriting every id would cost what the key's window holds, so
// the ids go to buckets, of which it rewrites only the parts that changed:
// the current bucket's last part at least, up to partIDs ids. Inline, a
// snapshot rewrites at most inlineIDs ids (about a kilobyte), no more
// than a bucket's part holds of the ids of its last 1/16 of the window.
// (8 until session 36: keys with 9 to 32 ids, most keys after a minute of
// load at a million keys, then cost a core and a part to write and read,
// decoded from protobuf, and never stayed in the snapshot cache; at 32, a
// million keys after 90 s of load ran at 1.45x the events/s.)
const inlineIDs = 32

// InlineIDs is the most remembered ids a key's snapshot holds inline (in
// one record, packed where the store allows it); beyond it they are stored
// in time buckets.
const InlineIDs = inlineIDs

// seenID is an id and when it was applied, as snapshots store them.
type seenID struct {
	id string
	at int64
}

type idIndex struct {
	slots         []uint32
	used, dropped int32
	wide          bool
}

// narrowLimit is the log length from which index slots hold offsets alone
// (16 MiB of ids, about a million; a variable for tests).
var narrowLimit = 1<<24 - 1

// idSeed seeds the ids' hashes (the index): per process, so that ids
// chosen by a client cannot be made to collide.
var idSeed = maphash.MakeSeed()

// partIDs is the most ids one stored part of a bucket holds. A checkpoint
// rewrites the part a key's new ids are numbered into, the ids already in
// it too, so what it writes is up to a part per changed bucket: at 256
// (until session 37) keys of a hundred thousand, taking a few events
// between checkpoints and remembering a few dozen ids, rewrote every id at
// each one (a fifth of the node's CPU, BENCHMARKS.md session 37); at 32 a
// checkpoint rewrites 16 ids on average, and a key coming back into memory
// reads a part per 32 ids, in the same batched read as its core.
const partIDs = 32

// PartIDs is the most remembered ids a stored part of a bucket holds.
const PartIDs = partIDs

// legacyPartIDs is the part size of snapshots that do not record theirs
// (KeyState.seen_part_ids), written before it was 32.
const legacyPartIDs = 256

// partsOf is the number of parts of a bucket whose ids were numbered up to
// added.
func partsOf(added int) int { return partsOfSize(added, partIDs) }

// partsOfSize is partsOf for parts of size ids (a stored layout's).
func partsOfSize(added, size int) int { return (added + size - 1) / size }

type bucketInfo struct {
	bucket int64
	// Its ids are a run of the log (ids are added in time order): from
	// the entry at start, whose time is a delta from startAt. Its last
	// part's first id (numbered tailNum) is at tail, after tailAt, unless
	// it expired: a checkpoint writes that part without reading the run.
	start, tail     int32
	startAt, tailAt int64
	count           int // its ids in memory: the last count of those numbered
	// added numbers the bucket's ids as they are added (id k is in part
	// k/partIDs); saved is added as of the last snapshot stored, whose
	// parts below saved/partIDs hold what they will hold; marks are added
	// as of the snapshots taken since, which Persisted turns into saved.
	added, saved int
	marks        []partMark
}

// partMark is a bucket's added as of a snapshot taken at version.
type partMark struct {
	version uint64
	added   int
}

// maxMarks bounds the marks a bucket keeps: snapshots taken but not stored
// (checkpoints failing). Dropping the oldest only rewrites more parts.
const maxMarks = 4

// multipart reports whether a bucket is stored in more than one part (the
// core then lists the parts of each).
func (d *idSet) multipart() bool {
	for i := range d.buckets {
		if d.buckets[i].added > partIDs {
			return true
		}
	}
	return false
}

// changed reports whether the bucket has ids its stored parts lack.
func (b *bucketInfo) changed() bool { return b.added > b.saved }

type goneBucket struct {
	bucket  int64
	version uint64 // State.version when it emptied
	parts   int    // the parts it may have stored
}

func (d *idSet) len() int { return int(d.n) }

// has reports whether the set holds id itself (not only its fingerprint).
func (d *idSet) has(id string) bool {
	dup, _ := d.check(id, 0)
	return dup
}

// check reports whether the set holds id itself (dup), and else whether it
// holds fp, the id's fingerprint (held): one of the ids applied before the
// state was restored from a store with an id index has that fingerprint,
// and only the index tells whether it is this id. fp 0 (no fingerprint
// is) asks only for the id itself, as has does.
func (d *idSet) check(id string, fp uint32) (dup, held bool) {
	if d.index == nil && d.n > scanIDs {
		if d.n > maxScanIDs || d.scans >= indexAfterScans {
			d.reindex() // (sized for the ids there are: no growth on the way)
		} else {
			d.scans++
		}
	}
	if x := d.index; x != nil {
		if x.probe(d, maphash.String(idSeed, id), func(e []byte, isFP bool) bool { return !isFP && string(e) == id }) {
			return true, false
		}
		return false, d.fps && fp != 0 && x.probe(d, fpHash(fp), func(e []byte, isFP bool) bool { return isFP && binary.LittleEndian.Uint32(e) == fp })
	}
	for c := d.cursor(); c.more(); {
		e, _ := c.next()
		if !c.fp {
			if string(e) == id {
				return true, false
			}
		} else if binary.LittleEndian.Uint32(e) == fp {
			held = true
		}
	}
	return false, held
}

// probe reports whether an id of hash h that the set holds matches.
func (x *idIndex) probe(d *idSet, h uint64, match func(e []byte, isFP bool) bool) bool {
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			return false
		}
		if !x.wide {
			if v>>24 != uint32(h>>56) {
				continue
			}
			v &= 1<<24 - 1
		}
		if off := int32(v-1) - x.dropped; off >= d.head {
			if e, isFP := d.idAt(off); match(e, isFP) {
				return true
			}
		}
	}
}

// fingerprintTimes returns the times of the ids the set holds as
// fingerprint fp, oldest first.
func (d *idSet) fingerprintTimes(fp uint32) []int64 {
	var ats []int64
	for c := d.cursor(); c.more(); {
		if e, at := c.next(); c.fp && binary.LittleEndian.Uint32(e) == fp {
			ats = append(ats, at)
		}
	}
	return ats
}

// holdsFingerprint reports whether fingerprint fp with time at is among
// the ids from c on.
func (d *idSet) holdsFingerprint(c idCursor, fp uint32, at int64) bool {
	for c.more() {
		if e, t := c.next(); c.fp && t == at && binary.LittleEndian.Uint32(e) == fp {
			return true
		}
	}
	return false
}

// hasFrom reports whether id is among the ids from the one whose entry
// starts at off (at or after head) to the newest.
func (d *idSet) hasFrom(off int, id string) bool {
	for c := (idCursor{d: d, off: off}); c.more(); {
		if e, _ := c.next(); !c.fp && string(e) == id {
			return true
		}
	}
	return false
}

// idCursor reads the ids in order, oldest first.
type idCursor struct {
	d   *idSet
	off int
	at  int64
	fp  bool // the id next returned is a fingerprint (its 4 bytes)
}

func (d *idSet) cursor() idCursor { return idCursor{d: d, off: int(d.head), at: d.baseAt} }

// runOf returns a cursor at the first id of bucket b's run.
func (d *idSet) runOf(b *bucketInfo) idCursor {
	return idCursor{d: d, off: int(b.start), at: b.startAt}
}

// tailNum is the number of the first id of the bucket's last part.
func (b *bucketInfo) tailNum() int { return (b.added - 1) / partIDs * partIDs }

// partAt returns a cursor at the id numbered num of bucket b and how many
// of its run's ids are before it: from the last part's start if num is
// there, else through the run.
func (d *idSet) partAt(b *bucketInfo, num int) (idCursor, int) {
	first := b.added - b.count // the number of the run's first id
	if t := b.tailNum(); num >= t && t >= first {
		c := idCursor{d: d, off: int(b.tail), at: b.tailAt}
		c.skip(num - t)
		return c, num - first
	}
	c := d.runOf(b)
	c.skip(num - first)
	return c, num - first
}

// renumbered finds the start of a bucket's last part anew, after its ids
// were numbered differently (a restore).
func (d *idSet) renumbered(b *bucketInfo) {
	first := b.added - b.count
	c := d.runOf(b)
	c.skip(max(b.tailNum()-first, 0))
	b.tail, b.tailAt = int32(c.off), c.at
}

func (c *idCursor) more() bool { return c.off < len(c.d.log) }

// next returns the next id (its bytes are the log's; a fingerprint's 4 if
// c.fp) and its time.
func (c *idCursor) next() ([]byte, int64) {
	delta, id, fp, n := idEntryAt(c.d.log[c.off:])
	c.fp = fp
	c.off += n
	c.at += delta
	return id, c.at
}

// nextAs is next for writing the id: its bytes, or its fingerprint (not
// 0) if the set holds only that or if the id's entry is before log offset
// fpBefore (the store's index holds it).
func (c *idCursor) nextAs(fpBefore int) (id []byte, fp uint32, at int64) {
	asFP := c.off < fpBefore
	e, at := c.next()
	switch {
	case c.fp:
		return nil, binary.LittleEndian.Uint32(e), at
	case asFP:
		return nil, idFingerprint(e), at
	}
	return e, 0, at
}

// skip passes over n ids.
func (c *idCursor) skip(n int) {
	for range n {
		c.next()
	}
}

// idAt returns the bytes of the id whose entry starts at off, and whether
// they are a fingerprint's.
func (d *idSet) idAt(off int32) ([]byte, bool) {
	_, e, fp, _ := idEntryAt(d.log[off:])
	return e, fp
}

// An id's entry, in the log and in the stored forms that keep ids as the
// log does (the packed form's ids since version 4, a stored part's packed
// form since its version 2): a uvarint header, then the fingerprint's 4
// bytes (little-endian), or the id's length (uvarint, not 0) and its
// bytes. The header's low bit is set for a fingerprint; its next bit says
// how the rest holds the id's time's difference from the previous id's:
// set, in whole seconds (the difference is a multiple of 1000 ms, not
// negative); clear, in ms, zigzagged. Under a dedup window of a minute or
// more a key keeps its ids' times to the second (Pipeline.idAt), so a
// fingerprint some 30 s after the previous id takes 5 bytes, where the
// entries of the packed form's version 3 took 7 (their difference always
// in ms), its version 2 8 or 9 and a SeenID message 14
// (BENCHMARKS.md, sessions 46 and 47). The difference between two ids'
// times is kept within ±2^60 ms (idTimeDelta), 36 million years.
func appendIDEntry[T string | []byte](b []byte, delta int64, id T, fp uint32) []byte {
	h := entryHeader(delta)
	if fp != 0 {
		return binary.LittleEndian.AppendUint32(binary.AppendUvarint(b, h|1), fp)
	}
	b = binary.AppendUvarint(b, h)
	b = binary.AppendUvarint(b, uint64(len(id)))
	return append(b, id...)
}

// entryHeader is an entry's header for a time difference of delta ms
// (within ±maxIDDelta), its fingerprint bit clear.
func entryHeader(delta int64) uint64 {
	if delta >= 0 && delta%1000 == 0 {
		return uint64(delta/1000)<<2 | 2
	}
	return uint64(delta<<1^delta>>63) << 2
}

// entryDelta is the time difference an entry's header holds.
func entryDelta(h uint64) int64 {
	if h&2 != 0 {
		return int64(h>>2) * 1000
	}
	return unzigzag(h >> 2)
}

// idEntryAt decodes the entry at the start of b, which the log wrote
// (appendIDEntry): its time's difference from the previous id's, its
// bytes (a fingerprint's 4 if fp), and its length.
func idEntryAt(b []byte) (delta int64, e []byte, fp bool, n int) {
	h, n := binary.Uvarint(b)
	delta = entryDelta(h)
	if h&1 != 0 {
		return delta, b[n : n+fpLen], true, n + fpLen
	}
	l, m := binary.Uvarint(b[n:])
	n += m
	return delta, b[n : n+int(l)], false, n + int(l)
}

func unzigzag(z uint64) int64 { return int64(z>>1) ^ -int64(z&1) }

// maxIDDelta bounds the difference between two ids' times that an entry
// keeps (its zigzag, shifted left by two, fits in 64 bits).
const maxIDDelta = 1 << 60

// idTimeDelta returns at - prev, within ±maxIDDelta: only the times of a
// state decoded from damaged bytes are further apart.
func idTimeDelta(at, prev int64) int64 {
	switch {
	case at >= prev && uint64(at)-uint64(prev) >= maxIDDelta:
		return maxIDDelta - 1
	case at < prev && uint64(prev)-uint64(at) > maxIDDelta:
		return -maxIDDelta
	}
	return at - prev
}

// appendIDEntries appends the entries of the next n ids of cursor c (or
// up to the newest), the first one's time from prev; those held in full
// before log offset fpBefore (the store's index holds them) as
// fingerprints. Entries the log holds as they are written are copied.
func appendIDEntries(dst []byte, c *idCursor, n int, prev int64, fpBefore int) []byte {
	for i := 0; i < n && c.more(); i++ {
		off := c.off
		id, fp, at := c.nextAs(fpBefore)
		if converted := !c.fp && fp != 0; i > 0 && !converted {
			dst = append(dst, c.d.log[off:c.off]...) // (its delta is from prev already)
		} else {
			dst = appendIDEntry(dst, idTimeDelta(at, prev), id, fp)
		}
		prev = at
	}
	return dst
}

// add remembers id, applied at (ms), which the set does not hold. Lookup
// and expiry hold for ids in any order, but the buckets a snapshot writes
// are runs of the log, so a state that is snapshotted gets its ids in time
// order: Apply adds at the key's processing time, which never goes back,
// and a restore adds them as stored.
func (d *idSet) add(id string, at int64, width int64) { addID(d, id, 0, at, width) }

// addBytes is add for an id in bytes (copied).
func (d *idSet) addBytes(id []byte, at int64, width int64) { addID(d, id, 0, at, width) }

// addFingerprint is add for an id the store's index holds, known by its
// fingerprint fp (not 0).
func (d *idSet) addFingerprint(fp uint32, at int64, width int64) { addID(d, "", fp, at, width) }

func addID[T string | []byte](d *idSet, id T, fp uint32, at int64, width int64) {
	if d.n == 0 {
		d.log, d.head, d.index = d.log[:0], 0, nil
		d.baseAt, d.lastAt, d.headAt = at, at, at
		d.fps, d.indexed, d.markOff, d.markV = false, 0, 0, 0
	}
	off, prevAt := len(d.log), d.lastAt
	delta := idTimeDelta(at, d.lastAt)
	at = d.lastAt + delta
	if fp != 0 {
		d.log = appendIDEntry(d.log, delta, id, fp)
		d.fps = true
		if int(d.indexed) == off {
			// (No id in full before it: the ids a key restored holds as
			// fingerprints come first, and unindexed starts after them.)
			d.indexed = int32(len(d.log))
		}
	} else {
		d.log = appendIDEntry(d.log, delta, id, 0)
	}
	d.lastAt = at
	d.n++
	if x := d.index; x != nil {
		if 4*(x.used+1) > 3*int32(len(x.slots)) || int(x.dropped)+len(d.log) >= x.limit() {
			d.reindex() // (which indexes the new id too)
		} else {
			d.insert(off)
		}
	}
	switch {
	case d.spilled:
		d.count(at/width, int32(off), prevAt)
	case d.n > inlineIDs:
		// Out of the core: none of the buckets is stored yet, so the next
		// snapshot writes them all.
		d.toBuckets(width)
	}
}

// toBuckets moves ids held inline into time buckets of width, numbered
// from 0 (none of them stored).
func (d *idSet) toBuckets(width int64) {
	d.spilled = true
	for c := d.cursor(); c.more(); {
		off, prevAt := c.off, c.at
		_, at := c.next()
		d.count(at/width, int32(off), prevAt)
	}
}

// insert indexes the id whose entry starts at off, in the first slot of
// its probe that is empty or holds an expired id.
func (d *idSet) insert(off int) {
	var h uint64
	if e, isFP := d.idAt(int32(off)); isFP {
		h = fpHash(binary.LittleEndian.Uint32(e))
	} else {
		h = maphash.Bytes(idSeed, e)
	}
	x := d.index
	slot := uint32(off + int(x.dropped) + 1)
	if !x.wide {
		slot |= uint32(h>>56) << 24
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		v := x.slots[i]
		if v == 0 {
			x.used++
		} else {
			if !x.wide {
				v &= 1<<24 - 1
			}
			if int32(v-1)-x.dropped >= d.head {
				continue
			}
		}
		x.slots[i] = slot
		return
	}
}

// limit is the offsets' bound in the index's slots.
func (x *idIndex) limit() int {
	if x.wide {
		return 1<<31 - 2
	}
	return narrowLimit
}

// reindex builds the index anew, at most half full: expired ids' slots go.
func (d *idSet) reindex() {
	size := 16
	for size < 2*int(d.n) {
		size *= 2
	}
	x := d.index
	if x == nil {
		x = &idIndex{}
		d.index = x
	}
	if cap(x.slots) >= size && cap(x.slots) <= 4*size {
		x.slots = x.slots[:cap(x.slots)]
		clear(x.slots)
	} else {
		x.slots = make([]uint32, size)
	}
	x.used, x.dropped, x.wide = 0, 0, len(d.log) >= narrowLimit
	for c := d.cursor(); c.more(); {
		off := c.off
		c.next()
		d.insert(off)
	}
}

// find returns the index of bucket b in d.buckets, or where it would go.
func (d *idSet) find(b int64) (int, bool) {
	// Ids arrive in time order: nearly always the last bucket.
	if n := len(d.buckets); n > 0 && d.buckets[n-1].bucket == b {
		return n - 1, true
	}
	return slices.BinarySearchFunc(d.buckets, b, func(bi bucketInfo, b int64) int { return cmp.Compare(bi.bucket, b) })
}

// count adds an id to bucket b: the one whose entry starts at off in the
// log, after an id of time prevAt.
func (d *idSet) count(b int64, off int32, prevAt int64) {
	i, ok := d.find(b)
	if !ok {
		d.buckets = slices.Insert(d.buckets, i, bucketInfo{bucket: b, start: off, startAt: prevAt})
	}
	if d.buckets[i].added%partIDs == 0 { // it starts a part
		d.buckets[i].tail, d.buckets[i].tailAt = off, prevAt
	}
	d.buckets[i].count++
	d.buckets[i].added++
}

// expire forgets the ids applied at or before horizon: those at the
// front of the log (ids are added in time order; one applied out of order
// waits for those before it).
func (d *idSet) expire(horizon, width int64, version uint64) {
	if horizon < d.headAt {
		return // the oldest is newer
	}
	n := int32(0)
	for c := d.cursor(); c.more(); {
		_, at := c.next()
		if at > horizon {
			d.headAt = at
			break
		}
		i, ok := 0, len(d.buckets) > 0 && d.buckets[0].bucket == at/width // the oldest ids' bucket, nearly always
		if !ok {
			i, ok = d.find(at / width)
		}
		if ok && d.spilled {
			if d.buckets[i].count--; d.buckets[i].count == 0 { // its stored copy must go
				d.gone = append(d.gone, goneBucket{bucket: d.buckets[i].bucket, version: version, parts: partsOf(d.buckets[i].added)})
				d.buckets = slices.Delete(d.buckets, i, i+1)
			}
		}
		d.head, d.baseAt = int32(c.off), at
		n++
	}
	if n == 0 {
		return
	}
	d.n -= n
	if len(d.buckets) > 0 { // the first bucket's run starts at the oldest id left
		d.buckets[0].start, d.buckets[0].startAt = d.head, d.baseAt
	}
	switch {
	case d.n == 0:
		d.log, d.head, d.index = nil, 0, nil // let the arrays go
		d.buckets = nil
		d.fps, d.indexed, d.markOff, d.markV = false, 0, 0, 0
		d.spilled = false // every stored bucket is gone
	case 2*int(d.head) > len(d.log):
		d.compact()
	}
	if d.n <= scanIDs/2 {
		d.index = nil // small again: searched in the log
	} else if x := d.index; x != nil && len(x.slots) > 8*max(16, 2*int(d.n)) {
		// Most of its ids expired: a table the size of those left. (A new
		// id takes an expired one's slot without counting as used, so
		// growth alone would keep a burst's table long after the burst.)
		// The set shrank eightfold since the last rebuild: its cost is
		// spread over the ids that left.
		d.reindex()
	}
}

// compact moves the live ids to a log of their own (not in place: a copy
// of the state may share the old one).
func (d *idSet) compact() {
	live := d.log[d.head:]
	d.log = append(make([]byte, 0, len(live)+len(live)/4), live...)
	for i := range d.buckets {
		d.buckets[i].start -= d.head
		d.buckets[i].tail -= d.head // (if it expired, no longer in the log)
	}
	if d.index != nil {
		d.index.dropped += d.head
	}
	d.indexed = max(d.indexed-d.head, 0)
	d.markOff = max(d.markOff-d.head, 0)
	d.head = 0
}

// persisted records that the snapshot of version is stored: the buckets'
// parts as of then, and the deletion of buckets emptied at or before it.
func (d *idSet) persisted(version uint64) {
	for i := range d.buckets {
		bi := &d.buckets[i]
		n := 0
		for n < len(bi.marks) && bi.marks[n].version <= version {
			bi.saved = max(bi.saved, bi.marks[n].added)
			n++
		}
		if bi.marks = bi.marks[n:]; len(bi.marks) == 0 {
			bi.marks = nil
		}
	}
	n := 0
	for n < len(d.gone) && d.gone[n].version <= version {
		n++
	}
	d.gone = d.gone[n:]
	if len(d.gone) == 0 {
		d.gone = nil
	}
	// (The mark's version as of its low 32 bits: a key changes fewer than
	// 2^31 times between a snapshot and the checkpoint storing it.)
	if int32(uint32(version)-d.markV) >= 0 {
		d.indexed = max(d.indexed, d.markOff)
	}
}

// unmark drops the mark of the last ids handed over (unindexed): a
// snapshot that hands none over is taken, so the one they were handed
// with may not be stored, and this one being stored says nothing of them.
// (If that one was stored, they are handed over again: the index keeps an
// id once.)
func (d *idSet) unmark() { d.markOff = d.indexed }

// IndexedID is an id a key applied, for the store's id index.
type IndexedID struct {
	ID string
	At int64 // when the key applied it (Unix ms)
}

// unindexed appends the ids the set holds in full that the store's index
// lacks (from indexed on) to ids, and marks the log's length as of
// version: once told that the snapshot of version is stored (persisted),
// they are indexed.
//
// The walk starts at indexed, not at the oldest id: an entry holds its
// time as the difference from the previous id's, so the times are counted
// back from the newest id's (lastAt, the sum of every difference from
// baseAt on). Walking from the oldest id, or the start of the last part,
// read up to 32 ids for the one or two a snapshot hands over: 38% of
// Pipeline.Snapshot at a million keys (BENCHMARKS.md, session 49).
func (d *idSet) unindexed(ids []IndexedID, version uint64) []IndexedID {
	c, fromIndexed := d.cursor(), false
	if int(d.indexed) > c.off {
		c, fromIndexed = idCursor{d: d, off: int(d.indexed)}, true // (at: 0)
	}
	first := len(ids)
	for c.more() {
		if e, at := c.next(); !c.fp {
			ids = append(ids, IndexedID{ID: string(e), At: at})
		}
	}
	if fromIndexed {
		before := d.lastAt - c.at // the time of the id before indexed
		for i := first; i < len(ids); i++ {
			ids[i].At += before
		}
	}
	d.markOff, d.markV = int32(len(d.log)), uint32(version)
	return ids
}
