package fold

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// MarshalState encodes a key's whole state (keyfold.v1.KeyState, ids
// inline; those the store's id index holds as their fingerprints).
// Aggregates are stored by name, so a pipeline may gain or lose
// aggregates between runs.
func (p *Pipeline) MarshalState(s *State) ([]byte, error) { return p.AppendState(nil, s) }

// AppendState is MarshalState appending to dst (decode it with
// RestoreParts or UnmarshalState); for a state
// whose snapshot is one part (OnePart) it is the core SnapshotParts
// encodes, with the fast encoder of pipelines without windows or patterns.
func (p *Pipeline) AppendState(dst []byte, s *State) ([]byte, error) {
	return p.appendState(dst, s, int(s.ids.indexed))
}

// appendState is AppendState writing the ids held in full before log
// offset fpBefore as their fingerprints.
func (p *Pipeline) appendState(dst []byte, s *State, fpBefore int) ([]byte, error) {
	if !p.Timed() && !s.ids.spilled {
		return p.appendCore(dst, s, fpBefore)
	}
	ks, err := p.coreProto(s)
	if err != nil {
		return nil, err
	}
	ks.Seen = seenProto(&s.ids, fpBefore)
	return proto.MarshalOptions{}.MarshalAppend(dst, ks)
}

// OnePart reports whether the key's snapshot is its core alone: its ids
// are inline, so restoring it needs no id bucket.
func (s *State) OnePart() bool { return !s.ids.spilled }

// StateProto returns a key's whole state as its persisted message, ids
// inline.
func (p *Pipeline) StateProto(s *State) (*keyfoldv1.KeyState, error) {
	ks, err := p.coreProto(s)
	if err != nil {
		return nil, err
	}
	ks.Seen = seenProto(&s.ids, int(s.ids.indexed))
	// The caller keeps the message, and the aggregates' sets change their
	// last values in place: it holds copies. (A snapshot's message is
	// marshalled in the key's actor, as it is built: no copy.)
	for _, as := range ks.Aggregates {
		as.LastJson = bytes.Clone(as.LastJson)
	}
	for _, ws := range ks.Windows {
		for _, as := range ws.Aggregates {
			as.LastJson = bytes.Clone(as.LastJson)
		}
	}
	return ks, nil
}

// seenProto is the ids in their stored form, oldest first; those held in
// full before log offset fpBefore as their fingerprints.
func seenProto(d *idSet, fpBefore int) []*keyfoldv1.SeenID {
	if d.len() == 0 {
		return nil
	}
	seen := make([]*keyfoldv1.SeenID, 0, d.len())
	for c := d.cursor(); c.more(); {
		id, fp, at := c.nextAs(fpBefore)
		seen = append(seen, &keyfoldv1.SeenID{Id: string(id), AtMs: at, Fingerprint: fp})
	}
	return seen
}

// coreProto is the state without its ids.
func (p *Pipeline) coreProto(s *State) (*keyfoldv1.KeyState, error) {
	ks := &keyfoldv1.KeyState{Seq: s.seq, NowMs: s.now, Duplicates: s.dups, WatermarkMs: s.Watermark(), Late: s.Late()}
	for i := range p.aggs {
		as, err := aggProto(&p.aggs[i], p.ops, &s.aggs, i)
		if err != nil {
			return nil, err
		}
		if as != nil {
			ks.Aggregates = append(ks.Aggregates, as)
		}
	}
	wins, err := p.windowsProto(s)
	if err != nil {
		return nil, err
	}
	ks.Windows = wins
	for i, w := range p.windows { // sorted by name
		if n := s.LateIn(i); n > 0 {
			ks.LateWindows = append(ks.LateWindows, &keyfoldv1.WindowLate{Name: w.name, Late: n})
		}
	}
	p.patternsProto(s, ks)
	ks.Join = joinProto(s)                        // join.go
	if err := p.handlerProto(s, ks); err != nil { // handler.go
		return nil, err
	}
	return ks, nil
}

// aggProto encodes the state of agg, aggregate i of a set of ops, nil
// while it is empty.
func aggProto(agg *aggregate, ops []Op, a *aggSet, i int) (*keyfoldv1.AggregateState, error) {
	count := a.count(i)
	if count == 0 {
		return nil, nil
	}
	sk, err := encodeSketch(a, i)
	if err != nil {
		return nil, fmt.Errorf("fold: encode aggregate %q: %w", agg.name, err)
	}
	return &keyfoldv1.AggregateState{Name: agg.name, Op: agg.op.String(), Count: count, Number: a.numOf(ops[i], i), LastJson: a.lastOf(ops[i], i), Sketch: sk}, nil
}

// restoreAgg finds the state of agg, aggregate i of a set of ops
// (allocated), among stored ones by name; one of another op is ignored
// (the aggregate starts afresh).
func restoreAgg(agg *aggregate, stored []*keyfoldv1.AggregateState, ops []Op, a *aggSet, i int) error {
	for _, as := range stored {
		if as.Name != agg.name || (as.Op != "" && as.Op != agg.op.String()) {
			continue
		}
		a.restore(ops, i, as.Count, as.Number, as.LastJson)
		if err := decodeSketch(agg.op, as.Sketch, a, len(ops), i); err != nil {
			return fmt.Errorf("fold: aggregate %q: %w", as.Name, err)
		}
	}
	return nil
}

// UnmarshalState decodes a state written by MarshalState. Aggregates the
// pipeline no longer has are dropped; new ones, and ones whose op changed,
// start empty.
func (p *Pipeline) UnmarshalState(b []byte) (State, error) {
	var ks keyfoldv1.KeyState
	if err := proto.Unmarshal(b, &ks); err != nil {
		return State{}, fmt.Errorf("fold: decode state: %w", err)
	}
	return p.StateFromProto(&ks)
}

// StateFromProto rebuilds a key's state from its persisted message with ids
// inline (nil is the empty state).
func (p *Pipeline) StateFromProto(ks *keyfoldv1.KeyState) (State, error) {
	if ks == nil {
		return State{}, nil
	}
	if len(ks.SeenBuckets) > 0 {
		return State{}, fmt.Errorf("fold: state keeps its ids in %d buckets: restore it with RestoreParts", len(ks.SeenBuckets))
	}
	s, err := p.stateFromCore(ks)
	if err != nil {
		return State{}, err
	}
	newest := newestRun{at: math.MinInt64}
	p.loadIDs(&s, ks.Seen, &newest)
	return s, nil
}

func (p *Pipeline) stateFromCore(ks *keyfoldv1.KeyState) (State, error) {
	// A restored state is at version 1, all of it stored: see Persisted.
	s := State{seq: ks.Seq, dups: ks.Duplicates, now: ks.NowMs, aggs: makeAggSet(len(p.ops), 0), version: RestoredVersion}
	for i := range p.aggs {
		if err := restoreAgg(&p.aggs[i], ks.Aggregates, p.ops, &s.aggs, i); err != nil {
			return State{}, err
		}
	}
	if !p.Timed() {
		return s, nil // event-time state of windows and patterns no longer configured: dropped
	}
	s.timeState = &timeState{wm: ks.WatermarkMs, late: ks.Late}
	if err := p.restoreWindows(&s, ks.Windows); err != nil {
		return State{}, err
	}
	for _, wl := range ks.LateWindows { // of windows no longer configured: dropped
		for i, w := range p.windows {
			if w.name == wl.Name && wl.Late > 0 {
				if len(s.lateWin) < len(p.windows) {
					s.lateWin = make([]uint64, len(p.windows))
				}
				s.lateWin[i] = wl.Late
			}
		}
	}
	p.restorePatterns(&s, ks)
	p.restoreJoin(&s, ks.Join)                               // join.go
	if err := p.restoreHandler(&s, ks.Handler); err != nil { // handler.go
		return State{}, err
	}
	return s, nil
}

// RestoredVersion is the version of a state rebuilt from the store: its
// parts as of this version are stored.
const RestoredVersion = 1

// loadIDs adds stored ids (oldest first) to a restored state, skipping those
// that have expired by the state's clock and those it holds already (a
// bucket stored whole before buckets had parts shares ids with the part
// written after it).
//
// newest is the latest time of the ids loaded so far and where the first of
// them is in the log (newestRun{at: math.MinInt64} for none), which loadIDs
// advances. An id has one time, the one it was applied at, so an id newer
// than all of them cannot be one of them, and one of their time can only
// be among those of that time, at the end of the log: a restore, whose ids
// come in time order, neither searches the ids loaded before (up to
// scanIDs of them, each time) nor indexes them as it goes. (A key's events
// of one commit share its time: searching all of its ids for those built
// each restored key's index, BENCHMARKS.md session 37.)
func (p *Pipeline) loadIDs(s *State, ids []*keyfoldv1.SeenID, newest *newestRun) {
	for _, e := range ids {
		p.restoreSeen(s, e.Id, e.Fingerprint, e.AtMs, newest)
	}
}

// newestRun is the time of the newest ids a restore loaded, and the log
// offset of the first of them (loadIDs).
type newestRun struct {
	at   int64
	off  int
	base int64 // the time of the id before off (its entry's delta is from it)
}

// restoreSeen adds a stored SeenID to a restored state unless it expired
// or the state holds it already (loadIDs): an id, or its fingerprint fp if
// the id is empty and fp is not 0 (the store's index holds the id). A
// fingerprint held already with the same time is not added again, as an
// id is not: what two ids of one fingerprint applied in the same
// millisecond leave is the same either way, a look-up under that time's
// bucket. An empty id without one was never applied.
func (p *Pipeline) restoreSeen(s *State, id string, fp uint32, at int64, newest *newestRun) {
	isFP := id == "" && fp != 0
	if at <= s.now-p.dedupWindow.Milliseconds() || (id == "" && !isFP) {
		return // expired, or never applied
	}
	d := &s.ids
	held := false
	switch {
	case at > newest.at:
	case at == newest.at && isFP:
		held = d.holdsFingerprint(idCursor{d: d, off: newest.off, at: newest.base}, fp, at)
	case at == newest.at:
		held = d.hasFrom(newest.off, id)
	case isFP:
		held = d.holdsFingerprint(d.cursor(), fp, at)
	default:
		held = d.has(id)
	}
	if held {
		return
	}
	off, base := len(d.log), d.lastAt // where add puts it
	if d.n == 0 {
		off, base = 0, at
	}
	if isFP {
		d.addFingerprint(fp, at, p.bucketWidth())
	} else {
		d.add(id, at, p.bucketWidth())
	}
	if at > newest.at {
		*newest = newestRun{at, off, base}
	}
}

// Parts is a key's snapshot in the snapshot store's form: the core state,
// which lists the id buckets, and the buckets that changed.
type Parts struct {
	// The core state: encoded (a keyfold.v1.KeyState) for a pipeline
	// without windows or patterns, else as a message; the other is nil.
	Core     *keyfoldv1.KeyState
	CoreData []byte
	// Packed: CoreData is the state's packed form (AppendPacked, ids
	// inline), not a KeyState (SnapshotPartsPacked).
	Packed bool
	// Buckets are the id buckets changed after the version given to
	// SnapshotParts; a nil Data deletes the stored bucket.
	Buckets []BucketPart
	// NextTimer is the key's next timer (see Pipeline.NextTimer), 0 if none.
	NextTimer int64
	// Version is the state's version the parts reflect; pass it to
	// Persisted once they are stored.
	Version uint64
	// IDs are the ids the parts hold as fingerprints that the store's id
	// index lacks (SnapshotOptions.IDIndex): they must be stored in it
	// with the parts, atomically.
	IDs []IndexedID
}

// CoreState returns the core state as a message, decoding CoreData if that
// is its form.
func (parts *Parts) CoreState() (*keyfoldv1.KeyState, error) {
	if parts.Core != nil || parts.CoreData == nil {
		return parts.Core, nil
	}
	if parts.Packed {
		return nil, errors.New("fold: core state is packed")
	}
	var ks keyfoldv1.KeyState
	if err := proto.Unmarshal(parts.CoreData, &ks); err != nil {
		return nil, fmt.Errorf("fold: decode core state: %w", err)
	}
	return &ks, nil
}

// BucketPart is one stored part of an id bucket: an encoded
// keyfold.v1.SeenBucket, or its packed form (SnapshotOptions.PackedParts).
type BucketPart struct {
	Bucket int64
	Part   int
	Data   []byte
}

// SnapshotParts returns what to store to bring a key's stored snapshot up to
// date, given that its parts as of version since are stored already: 0 when
// nothing is (a new key), RestoredVersion for a key just restored, else the
// Version of the last Parts stored. The state itself knows which parts of
// its id buckets are stored (from Persisted, and from the restore it came
// from), so since must be what the state was last told: a state restored
// from one store and snapshotted for another is not written whole.
func (p *Pipeline) SnapshotParts(s *State, since uint64) (Parts, error) {
	return p.SnapshotPartsAppend(s, since, nil)
}

// SnapshotPartsAppend is SnapshotParts appending the encoded core, when
// there is one (Parts.CoreData), to dst: a caller that knows about how
// large it is, or wants room before it, allocates once.
func (p *Pipeline) SnapshotPartsAppend(s *State, since uint64, dst []byte) (Parts, error) {
	return p.Snapshot(s, since, dst, SnapshotOptions{})
}

// SnapshotPartsPacked is SnapshotPartsAppend with the core in its packed
// form (Parts.Packed) where the state packs positionally (the pipeline has
// a Shape, the state's ids are inline: OnePart); in the KeyState's
// otherwise.
func (p *Pipeline) SnapshotPartsPacked(s *State, since uint64, dst []byte) (Parts, error) {
	return p.Snapshot(s, since, dst, SnapshotOptions{Packed: true})
}

// SnapshotOptions say what form of a snapshot the store takes.
type SnapshotOptions struct {
	// Packed: the core in its packed form where the state packs
	// positionally (SnapshotPartsPacked).
	Packed bool
	// IDIndex: the store keeps an id index (persistence.Store.LookupIDs).
	// The snapshot then holds each id as its 4-byte fingerprint, and
	// Parts.IDs lists the ids the index lacks, to store with it. A key
	// restored from it looks an event's id up in the index only when the
	// id has the fingerprint of one applied before (ApplyEvent).
	IDIndex bool
	// PackedParts: the id buckets' parts in their packed form
	// (appendPackedPart), for a store that allows packed snapshots (a
	// keyfold that does not know the form fails to decode it, it does not
	// misread it); else as keyfold.v1.SeenBucket messages.
	PackedParts bool
}

// Snapshot is SnapshotPartsAppend in the form o says.
func (p *Pipeline) Snapshot(s *State, since uint64, dst []byte, o SnapshotOptions) (Parts, error) {
	packed := o.Packed && p.shape != nil && s.OnePart()
	parts := Parts{Version: s.version, NextTimer: p.NextTimer(s), Packed: packed}
	// The ids held in full before fpBefore are written as fingerprints:
	// those the index holds already, or every id once it is given those it
	// lacks (parts.IDs, stored with the parts).
	fpBefore := int(s.ids.indexed)
	if o.IDIndex {
		fpBefore = len(s.ids.log)
		parts.IDs = s.ids.unindexed(nil, s.version)
	} else {
		s.ids.unmark() // it hands nothing over
	}
	var err error
	if packed {
		if parts.CoreData, err = p.appendPacked(dst, s, fpBefore); err != nil {
			return Parts{}, err
		}
	} else if p.Timed() {
		if parts.Core, err = p.coreProto(s); err != nil {
			return Parts{}, err
		}
		if s.ids.spilled {
			if len(s.ids.buckets) > 0 {
				parts.Core.SeenPartIds = partIDs
			}
			multi := s.ids.multipart()
			for _, bi := range s.ids.buckets { // in bucket order
				parts.Core.SeenBuckets = append(parts.Core.SeenBuckets, bi.bucket)
				if multi {
					parts.Core.SeenBucketParts = append(parts.Core.SeenBucketParts, uint32(partsOf(bi.added)))
				}
			}
		} else {
			parts.Core.Seen = seenProto(&s.ids, fpBefore)
		}
	} else if parts.CoreData, err = p.appendCore(dst, s, fpBefore); err != nil {
		return Parts{}, err
	}
	for _, g := range s.ids.gone {
		if g.version <= since {
			continue
		}
		from := 0 // its stored parts go
		if i, back := s.ids.find(g.bucket); back && s.ids.spilled {
			// It holds ids again (a restore's new layout): they are
			// written whole below; only the parts beyond them go.
			from = partsOf(s.ids.buckets[i].added)
		}
		for part := from; part < g.parts; part++ {
			parts.Buckets = append(parts.Buckets, BucketPart{Bucket: g.bucket, Part: part})
		}
	}
	if !s.ids.spilled {
		return parts, nil // the ids are inline
	}
	// A bucket's ids are a run of the log (ids are added in time order),
	// its buckets' runs in bucket order. Of a bucket with ids its stored
	// parts lack, the parts from the one its stored ids end in are
	// written: the cost is that of what changed, not of the whole window,
	// nor of the bucket's fill.
	// A part's bytes: about an id's in the log and 4 of its SeenID's
	// framing each, allocated once.
	perID := (len(s.ids.log)-int(s.ids.head))/max(int(s.ids.n), 1) + 4
	for i := range s.ids.buckets {
		bi := &s.ids.buckets[i]
		if !bi.changed() {
			continue
		}
		first := bi.added - bi.count // the number of the run's first id
		// (Parts holding only ids that expired are not written: what they
		// hold in the store, if anything, is dropped again at load.)
		from := max(bi.saved, first) / partIDs
		c, j := s.ids.partAt(bi, max(from*partIDs, first)) // j: the run's ids before c
		for part := from; part < partsOf(bi.added); part++ {
			lo, hi := max(part*partIDs, first)-first, min((part+1)*partIDs, bi.added)-first
			c.skip(lo - j)
			var data []byte // nil (deleted) if all its ids expired
			switch {
			case hi <= lo:
			case o.PackedParts:
				data = appendPackedPart(make([]byte, 0, 2+(hi-lo)*perID), &c, hi-lo, fpBefore)
			default:
				data = make([]byte, 0, (hi-lo)*perID)
				for range hi - lo {
					data = appendSeenID(data, sbIDs, &c, fpBefore)
				}
			}
			j = max(hi, lo)
			parts.Buckets = append(parts.Buckets, BucketPart{Bucket: bi.bucket, Part: part, Data: data})
		}
		if len(bi.marks) == maxMarks {
			bi.marks = slices.Delete(bi.marks, 0, 1)
		}
		bi.marks = append(bi.marks, partMark{version: s.version, added: bi.added})
	}
	return parts, nil
}

// Persisted records that the parts of version are stored.
func (s *State) Persisted(version uint64) { s.ids.persisted(version) }

// StoredParts returns how many parts the i-th id bucket a stored core lists
// is stored in (KeyState.seen_bucket_parts; one if it does not say).
func StoredParts(core *keyfoldv1.KeyState, i int) int {
	if parts := core.GetSeenBucketParts(); i < len(parts) && parts[i] > 1 {
		return int(parts[i])
	}
	return 1
}

// RestoreParts rebuilds a key's state from its stored core and, through
// load, the parts of the id buckets the core lists. load returns a part's
// data, or nil if it is not stored.
func (p *Pipeline) RestoreParts(core *keyfoldv1.KeyState, load func(bucket int64, part int) ([]byte, error)) (State, error) {
	if core == nil {
		return State{}, nil
	}
	s, err := p.stateFromCore(core)
	if err != nil {
		return State{}, err
	}
	newest := newestRun{at: math.MinInt64} // (loadIDs)
	p.loadIDs(&s, core.Seen, &newest)      // ids stored inline
	// The stored layout is usable as it is only if it is the one this
	// state would write (inline for a few ids, else buckets; never both)
	// and every id sits in the bucket this pipeline's width puts it in.
	rewrite := len(core.Seen) > 0 && len(core.SeenBuckets) > 0
	// Parts of another size number the ids differently: the next snapshot
	// writes the buckets anew in parts of partIDs.
	size := int(core.GetSeenPartIds())
	if size == 0 {
		size = legacyPartIDs
	}
	rewrite = rewrite || (len(core.SeenBuckets) > 0 && size != partIDs)
	stored := make([]int, len(core.SeenBuckets)) // each bucket's parts
	added := make(map[int64]int, len(core.SeenBuckets))
	for bi, b := range core.SeenBuckets {
		stored[bi] = StoredParts(core, bi)
		for part := range stored[bi] {
			data, err := load(b, part)
			if err != nil {
				return State{}, fmt.Errorf("fold: load id bucket %d part %d: %w", b, part, err)
			}
			if data == nil {
				if part == stored[bi]-1 { // the last part holds the newest id: always written
					return State{}, fmt.Errorf("fold: id bucket %d part %d is missing", b, part)
				}
				continue // its ids had all expired when the ones after it were written
			}
			n, misplaced, err := p.loadPart(&s, data, b, &newest)
			if err != nil {
				return State{}, fmt.Errorf("fold: decode id bucket %d part %d: %w", b, part, err)
			}
			rewrite = rewrite || misplaced
			added[b] = max(added[b], part*size+n)
		}
	}
	// (Loading spilled the ids if there are more than inlineIDs: idSet.add.)
	if s.ids.spilled == (len(core.SeenBuckets) == 0) {
		rewrite = true // inline ids too many now, or buckets that can go inline
	}
	if rewrite {
		// Nothing of the new layout is stored: every bucket is written
		// after RestoredVersion, and the old ones deleted.
		s.version = RestoredVersion + 1
		for bi, b := range core.SeenBuckets {
			s.ids.gone = append(s.ids.gone, goneBucket{bucket: b, version: s.version, parts: max(stored[bi], partsOfSize(added[b], size))})
		}
		return s, nil
	}
	// The ids continue each bucket's numbering, from what its parts hold.
	for i := range s.ids.buckets {
		bi := &s.ids.buckets[i]
		bi.added = max(added[bi.bucket], bi.count)
		bi.saved = bi.added
		s.ids.renumbered(bi)
	}
	for bi, b := range core.SeenBuckets {
		if _, ok := s.ids.find(b); !ok { // every id of it expired: it goes
			s.version = max(s.version, RestoredVersion+1)
			s.ids.gone = append(s.ids.gone, goneBucket{bucket: b, version: s.version, parts: max(stored[bi], partsOfSize(added[b], size))})
		}
	}
	return s, nil
}
