package fold

import (
	"cmp"
	"slices"
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
	// order holds the ids, oldest first. A set of a few ids is searched
	// there; beyond smallIDs, set indexes them too. (Most keys remember a
	// few ids, and a Go map costs a few hundred bytes even for one entry:
	// a key in memory is meant to take less than a KiB, BENCHMARKS.md.)
	order []seenID
	set   map[string]struct{}
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
}

// smallIDs is the most ids an idSet searches without an index.
const smallIDs = 8

// inlineIDs is the most ids a key's snapshot holds inline, in its core
// record: most keys remember a few ids, and one record instead of a core
// and a bucket halves the reads of a key coming back into memory and the
// writes of its checkpoints (BENCHMARKS.md). Beyond it a checkpoint
// rewriting every id would cost what the key's window holds, so the ids go
// to buckets, of which it rewrites only those that changed.
const inlineIDs = 8

type seenID struct {
	id string
	at int64
}

// partIDs is the most ids one stored part of a bucket holds.
const partIDs = 256

// partsOf is the number of parts of a bucket whose ids were numbered up to
// added.
func partsOf(added int) int { return (added + partIDs - 1) / partIDs }

type bucketInfo struct {
	bucket int64
	count  int // its ids in memory: the last count of those numbered
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

func (d *idSet) len() int { return len(d.order) }

func (d *idSet) has(id string) bool {
	if d.set != nil {
		_, ok := d.set[id]
		return ok
	}
	for i := range d.order {
		if d.order[i].id == id {
			return true
		}
	}
	return false
}

// find returns the index of bucket b in d.buckets, or where it would go.
func (d *idSet) find(b int64) (int, bool) {
	// Ids arrive in time order: nearly always the last bucket.
	if n := len(d.buckets); n > 0 && d.buckets[n-1].bucket == b {
		return n - 1, true
	}
	return slices.BinarySearchFunc(d.buckets, b, func(bi bucketInfo, b int64) int { return cmp.Compare(bi.bucket, b) })
}

func (d *idSet) add(id string, at int64, width int64) {
	d.order = append(d.order, seenID{id: id, at: at})
	switch {
	case d.set != nil:
		d.set[id] = struct{}{}
	case len(d.order) > smallIDs:
		d.set = make(map[string]struct{}, 2*len(d.order))
		for _, e := range d.order {
			d.set[e.id] = struct{}{}
		}
	}
	switch {
	case d.spilled:
		d.count(at / width)
	case len(d.order) > inlineIDs:
		// Out of the core: none of the buckets is stored yet, so the next
		// snapshot writes them all.
		d.spilled = true
		for _, e := range d.order {
			d.count(e.at / width)
		}
	}
}

// count adds an id to bucket b.
func (d *idSet) count(b int64) {
	i, ok := d.find(b)
	if !ok {
		d.buckets = slices.Insert(d.buckets, i, bucketInfo{bucket: b})
	}
	d.buckets[i].count++
	d.buckets[i].added++
}

// expire forgets the ids applied at or before horizon.
func (d *idSet) expire(horizon, width int64, version uint64) {
	n := 0
	for n < len(d.order) && d.order[n].at <= horizon {
		e := d.order[n]
		if d.set != nil {
			delete(d.set, e.id)
		}
		if i, ok := d.find(e.at / width); ok && d.spilled {
			if d.buckets[i].count--; d.buckets[i].count == 0 { // its stored copy must go
				d.gone = append(d.gone, goneBucket{bucket: d.buckets[i].bucket, version: version, parts: partsOf(d.buckets[i].added)})
				d.buckets = slices.Delete(d.buckets, i, i+1)
			}
		}
		n++
	}
	if n > 0 {
		d.order = d.order[n:]
		if len(d.order) == 0 {
			d.order, d.buckets = nil, nil // let the backing arrays go
			d.spilled = false             // every stored bucket is gone
		}
		if len(d.order) <= smallIDs/2 {
			d.set = nil // small again: searched in order
		}
	}
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
}
