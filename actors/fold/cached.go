package fold

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The snapshot cache's form of a key whose ids are in buckets.
//
// The packed form holds a state whose ids are inline (AppendPacked): it is
// also a stored form, and unpacked, a state whose snapshot keeps its ids
// in buckets would not know which parts the store holds. So keys
// remembering more than inlineIDs ids were never cached, and after a few
// minutes of load at a million keys most keys are past it: each came back
// into memory with a store read of its core and parts and their protobuf
// decoding (38.8k events/s after seven minutes against 92.8k after 30 s,
// BENCHMARKS.md session 36).
//
// The cache holds such a key as long as its snapshot in the store holds
// its state (a clean key, see actors/cache.go), and gives it back exactly
// as it was in memory: packed with its ids inline, after a table of its
// buckets and how many ids each had numbered (bucketInfo.added). All of
// them are stored (saved = added): the key is clean. A form of its own,
// which the cache alone writes and reads: UnpackState, which reads stored
// states, refuses it.
//
//	packedBuckets  buckets: n, then per bucket: bucket added; then the
//	               state's packed form (AppendPacked's: packedEntries or
//	               packedProto)
//
// The spill (actors/spill.go) keeps a changed key in memory's stead until
// a checkpoint writes it, in a form of its own too. Until session 45 it
// kept only keys whose ids are inline (AppendPacked): after ten minutes
// at a million keys most changed keys remembered more than inlineIDs ids,
// stayed in memory as grains until a checkpoint, and the checkpoints came
// when memory was full rather than when the log asked (BENCHMARKS.md,
// session 44). Its form of such a key says, besides each bucket's
// numbering, how many of the bucket's ids its stored parts lack, and
// which buckets' stored parts must go:
//
//	packedChanged  buckets: n, then per bucket: bucket added unsaved;
//	               then gone buckets: n, then per bucket: bucket parts;
//	               then the state's packed form
const (
	packedBuckets = 3
	packedChanged = 4
)

// maxGoneParts bounds the parts a gone bucket of a decoded form may list
// for deletion: those of a bucket numbering the most ids one can.
const maxGoneParts = (math.MaxInt32 + partIDs - 1) / partIDs

// AppendCached appends s as the snapshot cache keeps it, for a state whose
// stored snapshot holds it (it must be told so first: Persisted), to dst;
// decode it with UnpackCached. A state whose ids are inline is packed
// (AppendPacked); one with ids in buckets is packed with them inline after
// its buckets' table. A state with changes its snapshot lacks (ids or
// buckets to delete) is refused: the cache must not forget them.
func (p *Pipeline) AppendCached(dst []byte, s *State) ([]byte, error) {
	if s.OnePart() {
		return p.AppendPacked(dst, s)
	}
	d := &s.ids
	if len(d.gone) > 0 {
		return nil, errors.New("fold: cache state: id buckets to delete")
	}
	for i := range d.buckets {
		if bi := &d.buckets[i]; bi.changed() {
			return nil, fmt.Errorf("fold: cache state: id bucket %d has ids not stored", bi.bucket)
		}
	}
	dst = appendBucketTable(append(dst, packedBuckets), d.buckets, false)
	return p.appendPacked(dst, s, int(d.indexed))
}

// AppendSpilled appends s, a state that may be newer than its stored
// snapshot, as the spill keeps it, to dst; decode it with UnpackCached,
// and once a snapshot of the state it holds is stored, give it to the
// snapshot cache as StoredCached makes it. A Packable state is packed
// (AppendPacked); any other is packed with its ids inline after the table
// of its buckets and of the buckets to delete. What snapshots taken of it
// but not known to be stored (Persisted) wrote is forgotten: the snapshot
// of the state decoded writes it again.
func (p *Pipeline) AppendSpilled(dst []byte, s *State) ([]byte, error) {
	if s.Packable() {
		return p.AppendPacked(dst, s)
	}
	d := &s.ids
	dst = appendBucketTable(append(dst, packedChanged), d.buckets, true)
	dst = binary.AppendUvarint(dst, uint64(len(d.gone)))
	for _, g := range d.gone {
		dst = binary.AppendVarint(dst, g.bucket)
		dst = binary.AppendUvarint(dst, uint64(g.parts))
	}
	return p.appendPacked(dst, s, int(d.indexed))
}

// StoredCached appends to dst the snapshot cache's form (AppendCached) of
// the state data holds in the spill's (AppendSpilled), for when a snapshot
// of that state is stored: every id of its buckets is stored then, and no
// bucket is left to delete.
func StoredCached(dst, data []byte) ([]byte, error) {
	if len(data) == 0 || data[0] != packedChanged {
		return append(dst, data...), nil
	}
	r := packedReader{b: data[1:]}
	table := readBucketTable(&r, true)
	readGone(&r)
	if r.err != nil {
		return nil, fmt.Errorf("fold: spilled state: %w", r.err)
	}
	if len(table) == 0 { // its ids are inline
		return append(dst, r.b...), nil
	}
	for i := range table {
		table[i].saved = table[i].added
	}
	dst = appendBucketTable(append(dst, packedBuckets), table, false)
	return append(dst, r.b...), nil
}

// appendBucketTable appends the table of a state's buckets: their number,
// then each one's number and how many ids it numbered, and with unsaved,
// how many of those its stored parts lack.
func appendBucketTable(dst []byte, buckets []bucketInfo, unsaved bool) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(buckets)))
	for i := range buckets {
		bi := &buckets[i]
		dst = binary.AppendVarint(dst, bi.bucket)
		dst = binary.AppendUvarint(dst, uint64(bi.added))
		if unsaved {
			dst = binary.AppendUvarint(dst, uint64(bi.added-bi.saved))
		}
	}
	return dst
}

// readBucketTable reads what appendBucketTable wrote; without unsaved,
// every bucket's ids are stored. A problem is left in r.err.
func readBucketTable(r *packedReader, unsaved bool) []bucketInfo {
	table := make([]bucketInfo, r.count("id buckets"))
	for i := range table {
		b, added := r.varint(), r.uvarint()
		saved := added
		if unsaved {
			if u := r.uvarint(); u <= added {
				saved = added - u
			} else if r.err == nil {
				r.err = errors.New("an id bucket lacks more ids than it numbered")
			}
		}
		// (A bucket's ids are numbered within the log's int32 offsets.)
		if r.err == nil && (added == 0 || added > math.MaxInt32 || (i > 0 && b <= table[i-1].bucket)) {
			r.err = errors.New("id buckets out of order, empty or too large")
		}
		table[i] = bucketInfo{bucket: b, added: int(added), saved: int(saved)}
	}
	return table
}

// count reads the number of entries of a table of what, each of two bytes
// at least (0 if the rest cannot hold them: a problem left in r.err).
func (r *packedReader) count(what string) int {
	n := r.uvarint()
	if n > uint64(len(r.b))/2 {
		if r.err == nil {
			r.err = fmt.Errorf("too many %s", what)
		}
		return 0
	}
	return int(n)
}

// readGone reads the buckets to delete AppendSpilled wrote, at version
// RestoredVersion+1 (newer than what is stored). A problem is left in
// r.err.
func readGone(r *packedReader) []goneBucket {
	gone := make([]goneBucket, r.count("id buckets to delete"))
	for i := range gone {
		b, parts := r.varint(), r.uvarint()
		if r.err == nil && (parts == 0 || parts > maxGoneParts) {
			r.err = errors.New("an id bucket to delete has no parts or too many")
		}
		gone[i] = goneBucket{bucket: b, version: RestoredVersion + 1, parts: int(parts)}
	}
	return gone
}

// UnpackCached decodes what AppendCached or AppendSpilled encoded with
// this pipeline, to the state that was encoded (at RestoredVersion, its
// ids expired by its clock dropped; of a state with ids in buckets, its
// buckets' numbering as it was, and what of them its stored parts lack;
// of a spilled state with buckets to delete, at RestoredVersion+1, those
// buckets to delete at that version).
func (p *Pipeline) UnpackCached(data []byte) (State, error) {
	if len(data) == 0 || (data[0] != packedBuckets && data[0] != packedChanged) {
		return p.UnpackState(data)
	}
	changed := data[0] == packedChanged
	r := packedReader{b: data[1:]}
	table := readBucketTable(&r, changed)
	var gone []goneBucket
	if changed {
		gone = readGone(&r)
	}
	if r.err != nil {
		return State{}, fmt.Errorf("fold: cached state: %w", r.err)
	}
	s, err := p.UnpackState(r.b) // (which refuses a nested table)
	if err != nil {
		return State{}, err
	}
	switch {
	case len(table) > 0 || !changed:
		err = p.restoreBuckets(&s, table)
	case !s.OnePart():
		err = errors.New("its ids are in buckets, the table lists none")
	}
	if err != nil {
		return State{}, fmt.Errorf("fold: cached state: %w", err)
	}
	if len(gone) > 0 {
		s.version = RestoredVersion + 1
		s.ids.gone = append(s.ids.gone, gone...)
	}
	return s, nil
}

// restoreBuckets gives a state unpacked with its ids inline the buckets
// its snapshot stores them in (table: each bucket, its numbering and how
// much of it is stored), as RestoreParts does for the parts it reads: a
// bucket whose ids have all expired by the state's clock is deleted at
// its next snapshot, the others continue their numbering.
func (p *Pipeline) restoreBuckets(s *State, table []bucketInfo) error {
	d := &s.ids
	// (An unpacked state has not been snapshotted: RestoreParts of a
	// packedProto's inline ids may have asked for a rewrite, which the
	// table supersedes.)
	s.version, d.gone = RestoredVersion, nil
	if d.n > 0 && !d.spilled {
		d.toBuckets(p.bucketWidth()) // a few ids left: still in buckets, as in memory
	}
	found := 0 // of the state's buckets
	for _, e := range table {
		i, ok := d.find(e.bucket)
		if !ok { // every id of it expired: it goes
			s.version = RestoredVersion + 1
			d.gone = append(d.gone, goneBucket{bucket: e.bucket, version: s.version, parts: partsOf(e.added)})
			continue
		}
		found++
		bi := &d.buckets[i]
		if e.added < bi.count {
			return fmt.Errorf("id bucket %d numbered %d ids, holds %d", e.bucket, e.added, bi.count)
		}
		bi.added, bi.saved = e.added, e.saved
		d.renumbered(bi)
	}
	if found != len(d.buckets) { // (the table's buckets are distinct)
		return fmt.Errorf("%d id buckets hold ids, the table lists %d of them", len(d.buckets), found)
	}
	return nil
}
