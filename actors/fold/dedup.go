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
// id of the last 24 hours. A bucket is rewritten when an id is added to it
// and deleted when its last id expires; ids that expire from a bucket that
// still holds others stay in its stored copy and are dropped again when it
// is loaded, which gives back exactly the same set.
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

type bucketInfo struct {
	bucket  int64
	count   int
	changed uint64 // State.version of the last id added
}

type goneBucket struct {
	bucket  int64
	version uint64 // State.version when it emptied
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

func (d *idSet) add(id string, at int64, width int64, version uint64) {
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
		d.count(at/width, version)
	case len(d.order) > inlineIDs:
		// Out of the core: none of the buckets is stored yet, so the next
		// snapshot writes them all.
		d.spilled = true
		for _, e := range d.order {
			d.count(e.at/width, version)
		}
	}
}

// count adds an id to bucket b, changed at version.
func (d *idSet) count(b int64, version uint64) {
	i, ok := d.find(b)
	if !ok {
		d.buckets = slices.Insert(d.buckets, i, bucketInfo{bucket: b})
	}
	d.buckets[i].count++
	d.buckets[i].changed = version
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
				d.gone = append(d.gone, goneBucket{bucket: d.buckets[i].bucket, version: version})
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

// persisted drops the record of buckets emptied at or before version, whose
// deletion has reached the store.
func (d *idSet) persisted(version uint64) {
	n := 0
	for n < len(d.gone) && d.gone[n].version <= version {
		n++
	}
	d.gone = d.gone[n:]
	if len(d.gone) == 0 {
		d.gone = nil
	}
}
