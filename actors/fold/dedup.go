package fold

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
	at      map[string]int64 // id → when it was applied (the key's clock)
	order   []seenID         // the same ids, oldest first
	buckets map[int64]*bucketInfo
	gone    []goneBucket // emptied buckets whose stored copies must go
	// The bucket of the last add: ids arrive in time order, so it is
	// nearly always the next one's too.
	lastB    int64
	lastInfo *bucketInfo
}

type seenID struct {
	id string
	at int64
}

type bucketInfo struct {
	count   int
	changed uint64 // State.version of the last id added
}

type goneBucket struct {
	bucket  int64
	version uint64 // State.version when it emptied
}

func (d *idSet) len() int { return len(d.at) }

func (d *idSet) has(id string) bool {
	_, ok := d.at[id]
	return ok
}

func (d *idSet) add(id string, at int64, width int64, version uint64) {
	if d.at == nil {
		d.at = make(map[string]int64)
		d.buckets = make(map[int64]*bucketInfo)
	}
	d.at[id] = at
	d.order = append(d.order, seenID{id: id, at: at})
	bk := at / width
	b := d.lastInfo
	if b == nil || d.lastB != bk {
		if b = d.buckets[bk]; b == nil {
			b = &bucketInfo{}
			d.buckets[bk] = b
		}
		d.lastB, d.lastInfo = bk, b
	}
	b.count++
	b.changed = version
}

// expire forgets the ids applied at or before horizon.
func (d *idSet) expire(horizon, width int64, version uint64) {
	n := 0
	for n < len(d.order) && d.order[n].at <= horizon {
		e := d.order[n]
		delete(d.at, e.id)
		bk := e.at / width
		if b := d.buckets[bk]; b != nil {
			if b.count--; b.count == 0 {
				delete(d.buckets, bk)
				if d.lastInfo == b {
					d.lastInfo = nil
				}
				d.gone = append(d.gone, goneBucket{bucket: bk, version: version})
			}
		}
		n++
	}
	if n > 0 {
		d.order = d.order[n:]
		if len(d.order) == 0 {
			d.order = nil // let the backing array go
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
