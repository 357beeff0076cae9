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
//	               state's packed form (packedCore or packedProto)
const packedBuckets = 3

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
	dst = append(dst, packedBuckets)
	dst = binary.AppendUvarint(dst, uint64(len(d.buckets)))
	for i := range d.buckets {
		bi := &d.buckets[i]
		if bi.changed() {
			return nil, fmt.Errorf("fold: cache state: id bucket %d has ids not stored", bi.bucket)
		}
		dst = binary.AppendVarint(dst, bi.bucket)
		dst = binary.AppendUvarint(dst, uint64(bi.added))
	}
	return p.appendPacked(dst, s, int(d.indexed))
}

// UnpackCached decodes what AppendCached encoded with this pipeline, to the
// state that was encoded (at RestoredVersion, its ids expired by its clock
// dropped; of a state with ids in buckets, its buckets' numbering as it
// was, every id of them stored).
func (p *Pipeline) UnpackCached(data []byte) (State, error) {
	if len(data) == 0 || data[0] != packedBuckets {
		return p.UnpackState(data)
	}
	r := packedReader{b: data[1:]}
	n := r.uvarint()
	if n > uint64(len(r.b))/2 { // each takes two bytes at least
		return State{}, errors.New("fold: cached state: too many id buckets")
	}
	table := make([]bucketInfo, n)
	for i := range table {
		b, added := r.varint(), r.uvarint()
		// (A bucket's ids are numbered within the log's int32 offsets.)
		if r.err == nil && (added == 0 || added > math.MaxInt32 || (i > 0 && b <= table[i-1].bucket)) {
			r.err = errors.New("id buckets out of order, empty or too large")
		}
		table[i] = bucketInfo{bucket: b, added: int(added)}
	}
	if r.err != nil {
		return State{}, fmt.Errorf("fold: cached state: %w", r.err)
	}
	s, err := p.UnpackState(r.b) // (which refuses a nested table)
	if err != nil {
		return State{}, err
	}
	if err := p.restoreBuckets(&s, table); err != nil {
		return State{}, fmt.Errorf("fold: cached state: %w", err)
	}
	return s, nil
}

// restoreBuckets gives a state unpacked with its ids inline the buckets
// its snapshot stores them in (table: each bucket and its numbering, all
// of it stored), as RestoreParts does for the parts it reads: a bucket
// whose ids have all expired by the state's clock is deleted at its next
// snapshot, the others continue their numbering.
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
		bi.added, bi.saved = e.added, e.added
		d.renumbered(bi)
	}
	if found != len(d.buckets) { // (the table's buckets are distinct)
		return fmt.Errorf("%d id buckets hold ids, the table lists %d of them", len(d.buckets), found)
	}
	return nil
}
