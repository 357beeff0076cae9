package embedded

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/keyfold/keyfold/persistence"
	"google.golang.org/protobuf/encoding/protowire"
)

// The id index (persistence.CheckpointData.IDs, Store.LookupIDs) lives in a
// Pebble of its own, in the ids directory of the store's, whose
// compactions are off.
//
// Why: an index entry is written once, never changes, is read rarely (a
// look-up only when a key restored from its snapshot meets an id whose
// fingerprint it holds) and goes a minute at a time. In the store's Pebble
// each entry was rewritten at every level of the LSM it passed, merged with
// its neighbours, like a snapshot that changes at every round: at a million
// keys a quarter to a third of the node's CPU went to those compactions
// (BENCHMARKS.md, session 50). Here an entry is written to the WAL and
// flushed once into a level 0 table, which stays there until no group
// holds ids in its bucket any more; then the bucket is cut out of the
// tables whole (DB.Excise), nothing rewritten. The index holds only ids,
// bucket first, so that each table holds the few buckets that were
// current while its memtable filled: a look-up consults the Bloom filters
// of those tables only, and a bucket cut out frees the tables it spans.
//
//	'j' bucket:8 group:4 len:4 key id   an id, under its time bucket; the
//	                                    value is when its key applied it
//	                                    (int64 Unix ms, 8 bytes) and the
//	                                    group's drop generation it was
//	                                    stored in (uvarint)
//
// Everything else about the index is in the store's Pebble (keys.go),
// written with the checkpoints' snapshots:
//
//   - A group's drops (CheckpointData.DropIDsBefore) are not deletions:
//     they are recorded ('d' group: idDrops) and look-ups apply them. Each
//     drop starts a generation, and an id counts as dropped if a drop of a
//     later generation than the one it was stored in was above its bucket,
//     so that ids stored after a drop in the buckets below it are held
//     again, as the contract says, and the index's tables hold no range
//     deletions (which would make every table span the whole window).
//   - Which groups hold ids in which bucket ('h' bucket group, with the
//     latest Expires of those ids; held in memory too): a bucket no group
//     holds is cut out of the index by the next sweep after a drop. A
//     group's ids count as dropped where they all expired (the idle group's
//     case: no drops without events).
//   - The ids themselves until the index holds them ('n' group): the two
//     Pebbles commit apart, so the checkpoint's batch holds its ids as one
//     pending entry, committed with its snapshots; the index is written
//     after it (synced), and the pending entry deleted. A crash or a failed
//     write in between leaves the entry: every opening of the store writes
//     the pending entries into the index before it takes a call. A group's
//     look-ups wait while its checkpoint is between the two commits
//     (group.ids), so that a key's ids are found from the moment its
//     snapshot can be read, as with one batch.
type idIndex struct {
	db *pebble.DB
	// gate orders writes against the sweep: a checkpoint holds it shared
	// from the moment it records its buckets in held until its ids are in
	// the index, the sweep exclusively, so that it never cuts out a bucket
	// a checkpoint is writing into.
	gate sync.RWMutex
	mu   sync.Mutex
	// held is the 'h' entries: bucket → group → latest Expires (Unix ms;
	// math.MaxInt64: never).
	held map[int64]map[uint32]int64
	// written is the buckets the index may hold ids in that no sweep cut
	// out since it opened: every bucket of held, and those of the ids no
	// longer held.
	written map[int64]struct{}
	// expiredAt is when the sweep last forgot the groups whose ids
	// expired (Unix ms): once a minute at most.
	expiredAt int64
}

const (
	idsDir = "ids" // the index's Pebble, under the store's directory

	kindIndexedID = 'j'

	// IDIndexCacheSize is the id index's block cache: look-ups are rare,
	// and read the filters and index blocks of the few tables of their
	// bucket.
	IDIndexCacheSize = 32 << 20

	// expiryEvery spaces the sweep's looks for expired ids.
	expiryEvery = 60_000
)

// idsOptions returns the index's Pebble options: the store's (its
// filesystem, logger and listeners, so that a failed WAL write or a full
// disk fails and reopens the store as the store's own Pebble does, and its
// Bloom filters on every level), with compactions off and level 0
// unbounded.
func (s *Store) idsOptions() *pebble.Options {
	po := s.opts.pebbleOptions(s)
	po.CacheSize = IDIndexCacheSize
	po.DisableAutomaticCompactions = true
	po.L0CompactionThreshold = math.MaxInt32
	po.L0CompactionFileThreshold = math.MaxInt32
	po.L0StopWritesThreshold = math.MaxInt32
	// One table a flush: Pebble splits a flush into tables of 2 MiB by
	// default, to compact them apart, which here would only multiply the
	// tables a day of ids leaves (a first run at a million keys flushed
	// ~50 a minute).
	po.TargetFileSizes[0] = 1 << 30
	return po
}

// openIndex opens the id index, loads what db records of it, writes into
// it the checkpoints' pending ids that db holds (see idIndex), and reports
// whether db holds ids of the index an older format kept there.
func (s *Store) openIndex(db *pebble.DB) (*idIndex, bool, error) {
	dir := s.opts.fs.PathJoin(s.dir, idsDir)
	if err := s.opts.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, false, fmt.Errorf("id index: %w", describeDirError(err))
	}
	idb, err := s.openPebble(dir, s.idsOptions())
	if err != nil {
		return nil, false, fmt.Errorf("id index: %w", err)
	}
	x := &idIndex{db: idb, held: map[int64]map[uint32]int64{}, written: map[int64]struct{}{}}
	var legacy bool
	err = s.inPebble(func() error {
		if err := x.load(db); err != nil {
			return err
		}
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindID}, UpperBound: []byte{kindID + 1}})
		if err != nil {
			return err
		}
		legacy = it.First()
		return it.Close()
	})
	if err == nil {
		err = s.replayPendingIDs(db, x)
	}
	if err != nil {
		_ = s.inPebble(idb.Close)
		return nil, false, fmt.Errorf("id index: %w", err)
	}
	return x, legacy, nil
}

// load reads the 'h' entries of db into held, and finds the buckets the
// index holds ids in that no group holds (a drop or an expiry before the
// store closed, not swept yet): one seek each.
func (x *idIndex) load(db *pebble.DB) error {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindIDHeld}, UpperBound: []byte{kindIDHeld + 1}})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) != 1+8+4 {
			_ = it.Close()
			return fmt.Errorf("malformed held entry %q", k)
		}
		v, err := it.ValueAndErr()
		var exp uint64
		if err == nil {
			exp, err = decodeUint64(v)
		}
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("held entry %q: %w", k, err)
		}
		x.hold(int64(binary.BigEndian.Uint64(k[1:])), binary.BigEndian.Uint32(k[9:]), int64(exp))
	}
	if err := it.Close(); err != nil {
		return err
	}
	if it, err = x.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindIndexedID}, UpperBound: []byte{kindIndexedID + 1}}); err != nil {
		return err
	}
	for valid := it.First(); valid; {
		if len(it.Key()) < 1+8+4+4 {
			_ = it.Close()
			return fmt.Errorf("malformed index key %q", it.Key())
		}
		bucket := int64(binary.BigEndian.Uint64(it.Key()[1:]))
		x.written[bucket] = struct{}{}
		if bucket == math.MaxInt64 {
			break
		}
		valid = it.SeekGE(indexedIDGroupKey(nil, bucket+1, 0))
	}
	return it.Close()
}

// hold records that group holds ids in bucket until expires; x.mu held or
// x not shared yet.
func (x *idIndex) hold(bucket int64, group uint32, expires int64) {
	gs := x.held[bucket]
	if gs == nil {
		gs = map[uint32]int64{}
		x.held[bucket] = gs
	}
	gs[group] = max(gs[group], expires)
	x.written[bucket] = struct{}{}
}

// idPlan is what a checkpoint of a group changes in the index: computed
// before its batch, applied to memory after its commit.
type idPlan struct {
	drops  idDrops   // the group's drops after the checkpoint's
	unheld []int64   // buckets the group no longer holds (its drop)
	held   []idsHeld // buckets the group holds ids in, with their latest Expires
}

type idsHeld struct{ bucket, expires int64 }

// plan returns what a checkpoint of group with drop and ids changes, given
// the group's drops so far, and records its buckets as held (before the
// commit: held may name buckets a failed commit did not fill, which a
// sweep keeps a while longer, but never misses one it did). The caller
// holds gate shared until the index holds the ids.
func (x *idIndex) plan(group uint32, drops idDrops, drop int64, ids []persistence.StoredID) idPlan {
	p := idPlan{drops: drops}
	if drop > 0 {
		p.drops = drops.add(drop)
	}
	latest := map[int64]int64{}
	for _, id := range ids {
		exp := id.Expires
		if exp <= 0 {
			exp = math.MaxInt64
		}
		latest[id.Bucket] = max(latest[id.Bucket], exp)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if drop > 0 {
		for bucket, gs := range x.held {
			if _, ok := gs[group]; ok && bucket < drop {
				if _, again := latest[bucket]; !again {
					p.unheld = append(p.unheld, bucket)
				}
			}
		}
	}
	for bucket, exp := range latest {
		if drop > 0 && bucket < drop {
			delete(x.held[bucket], group) // what it held there was dropped
		}
		x.hold(bucket, group, exp)
		p.held = append(p.held, idsHeld{bucket, x.held[bucket][group]})
	}
	return p
}

// addToBatch adds the plan's changes of the store's records of the index
// to b.
func (p *idPlan) addToBatch(b *pebble.Batch, group uint32, dropped bool) error {
	for _, bucket := range p.unheld {
		if err := b.Delete(idHeldKey(bucket, group), nil); err != nil {
			return err
		}
	}
	var v [8]byte
	for _, h := range p.held {
		binary.BigEndian.PutUint64(v[:], uint64(h.expires))
		if err := b.Set(idHeldKey(h.bucket, group), v[:], nil); err != nil {
			return err
		}
	}
	if dropped {
		return b.Set(idDropsKey(group), p.drops.append(nil), nil)
	}
	return nil
}

// committed forgets the buckets the plan's group no longer holds.
func (x *idIndex) committed(group uint32, p *idPlan) {
	if len(p.unheld) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, bucket := range p.unheld {
		if gs := x.held[bucket]; gs != nil {
			delete(gs, group)
			if len(gs) == 0 {
				delete(x.held, bucket)
			}
		}
	}
}

// put stores ids of a group's drop generation gen (synced). It calls
// Pebble directly: callers run it in Store.write.
func (x *idIndex) put(group uint32, gen uint64, ids []persistence.StoredID) error {
	b := x.db.NewBatch()
	defer b.Close()
	var kb, v []byte
	for _, id := range ids {
		kb = appendIndexedIDKey(kb[:0], id.Bucket, group, id.Key, id.ID)
		v = binary.AppendUvarint(binary.BigEndian.AppendUint64(v[:0], uint64(id.At)), gen)
		if err := b.Set(kb, v, nil); err != nil {
			return err
		}
	}
	return b.Commit(pebble.Sync)
}

// indexIDs writes a committed checkpoint's ids into the id index and
// deletes their pending entry. A failed write fails the store, whose
// reopening writes the pending entry.
func (s *Store) indexIDs(group uint32, gen uint64, ids []persistence.StoredID) error {
	if err := s.write(func() error { return s.ids.put(group, gen, ids) }); err != nil {
		if !errors.Is(err, ErrFailed) {
			err = s.fail(fmt.Errorf("id index: %w", err))
		}
		return err
	}
	// Not synced: a pending entry found at the next opening is the
	// group's last with ids, and writing it again changes nothing.
	return s.write(func() error { return s.db.Delete(pendingIDsKey(group), pebble.NoSync) })
}

// replayPendingIDs writes the pending ids of db's checkpoints into x, then
// deletes them from db.
func (s *Store) replayPendingIDs(db *pebble.DB, x *idIndex) error {
	type pending struct {
		group uint32
		data  []byte
	}
	var ps []pending
	err := s.inPebble(func() error {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindPendingIDs}, UpperBound: []byte{kindPendingIDs + 1}})
		if err != nil {
			return err
		}
		for valid := it.First(); valid; valid = it.Next() {
			k := it.Key()
			if len(k) != 5 {
				_ = it.Close()
				return fmt.Errorf("malformed pending ids key %q", k)
			}
			v, err := it.ValueAndErr()
			if err != nil {
				_ = it.Close()
				return err
			}
			ps = append(ps, pending{binary.BigEndian.Uint32(k[1:]), bytes.Clone(v)})
		}
		return it.Close()
	})
	if err != nil || len(ps) == 0 {
		return err
	}
	for _, p := range ps {
		gen, ids, err := decodePendingIDs(p.data)
		if err != nil {
			return fmt.Errorf("pending ids of group %d: %w", p.group, err)
		}
		if err := s.write(func() error { return x.put(p.group, gen, ids) }); err != nil {
			return fmt.Errorf("pending ids of group %d: %w", p.group, err)
		}
	}
	err = s.write(func() error {
		b := db.NewBatch()
		for _, p := range ps {
			_ = b.Delete(pendingIDsKey(p.group), nil)
		}
		err := b.Commit(pebble.Sync)
		_ = b.Close()
		return err
	})
	if err != nil {
		return err
	}
	s.log.Info("id index: wrote the ids of checkpoints a crash or a failed write left pending", "dir", s.dir, "groups", len(ps))
	return nil
}

// sweepIDs cuts the buckets no group holds ids in out of the index. A
// failure is logged: the next drop's sweep tries again.
func (s *Store) sweepIDs() {
	if err := s.ids.sweep(s, s.opts.Now().UnixMilli()); err != nil {
		s.limitedError("id index: cutting out the dropped buckets failed (the next drop tries again)", err)
	}
}

// sweep cuts out of the index every bucket written since it opened that
// no group holds ids in any more (each group dropped it, or its ids there
// expired, now being Unix ms), a run of such buckets at a time: the
// tables wholly inside a run are removed, those across its ends cut down
// to what lies outside (Pebble makes virtual tables of those; nothing is
// rewritten). An excise of a span the memtable overlaps is applied to the
// tables at its flush.
func (x *idIndex) sweep(s *Store, now int64) error {
	// Most drops leave every bucket held by another group: then the
	// checkpoints in flight are not held up (the gate waits for their
	// syncs).
	if !x.expiryDue(now) && len(x.unheldRuns()) == 0 {
		return nil
	}
	x.gate.Lock()
	defer x.gate.Unlock()
	expired := x.expire(now)
	if len(expired) > 0 {
		err := s.write(func() error {
			b := s.db.NewBatch()
			for _, k := range expired {
				_ = b.Delete(k, nil)
			}
			// Not synced: an entry found again at the next opening has
			// expired still.
			err := b.Commit(pebble.NoSync)
			_ = b.Close()
			return err
		})
		if err != nil {
			return err
		}
	}
	for _, r := range x.unheldRuns() {
		span := pebble.KeyRange{Start: indexedIDGroupKey(nil, r[0], 0), End: indexedIDGroupKey(nil, r[1], 0)}
		if r[1] == math.MaxInt64 {
			span.End = []byte{kindIndexedID + 1}
		}
		if err := s.inPebble(func() error { return x.db.Excise(context.Background(), span) }); err != nil {
			return err
		}
		x.mu.Lock()
		for b := range x.written {
			if b >= r[0] && (b < r[1] || r[1] == math.MaxInt64) {
				delete(x.written, b)
			}
		}
		x.mu.Unlock()
	}
	return nil
}

func (x *idIndex) expiryDue(now int64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return now-x.expiredAt >= expiryEvery
}

// expire forgets the groups whose ids in a bucket all expired by now, once
// a minute at most, and returns the keys of their 'h' entries.
func (x *idIndex) expire(now int64) [][]byte {
	x.mu.Lock()
	defer x.mu.Unlock()
	if now-x.expiredAt < expiryEvery {
		return nil
	}
	x.expiredAt = now
	var expired [][]byte
	for bucket, gs := range x.held {
		for g, exp := range gs {
			if exp < now {
				delete(gs, g)
				expired = append(expired, idHeldKey(bucket, g))
			}
		}
		if len(gs) == 0 {
			delete(x.held, bucket)
		}
	}
	return expired
}

// unheldRuns returns the runs [first, end) of the buckets written that no
// group holds, between those held (end math.MaxInt64: every bucket from
// first on).
func (x *idIndex) unheldRuns() [][2]int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	var runs [][2]int64
	start, last := int64(-1), int64(0)
	for _, b := range slices.Sorted(maps.Keys(x.written)) {
		if _, held := x.held[b]; held {
			if start >= 0 {
				runs = append(runs, [2]int64{start, last + 1})
				start = -1
			}
			continue
		}
		if start < 0 {
			start = b
		}
		last = b
	}
	if start >= 0 {
		end := last + 1
		if last == math.MaxInt64 {
			end = math.MaxInt64
		}
		runs = append(runs, [2]int64{start, end})
	}
	return runs
}

// lookUp sets at[i] to the time the index holds lookups[i] with, where it
// holds it and drops did not drop it (leaving the others), from one view
// of the index.
func (x *idIndex) lookUp(group uint32, drops idDrops, lookups []persistence.IDLookup, at []int64, stop func() error) error {
	it, err := x.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindIndexedID}, UpperBound: []byte{kindIndexedID + 1}})
	if err != nil {
		return err
	}
	var kb []byte
	for i, l := range lookups {
		if i%256 == 255 {
			if err := stop(); err != nil {
				_ = it.Close()
				return err
			}
		}
		kb = appendIndexedIDKey(kb[:0], l.Bucket, group, l.Key, l.ID)
		v, ok, err := seekValue(it, kb)
		var t int64
		var gen uint64
		if ok {
			t, gen, err = decodeIndexedID(v)
		}
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("id %q of key %q: %w", l.ID, l.Key, err)
		}
		if ok && !drops.dropped(l.Bucket, gen) {
			at[i] = t
		}
	}
	return it.Close()
}

func decodeIndexedID(v []byte) (at int64, gen uint64, err error) {
	if len(v) < 9 {
		return 0, 0, errors.New("malformed index entry")
	}
	gen, n := binary.Uvarint(v[8:])
	if n != len(v)-8 {
		return 0, 0, errors.New("malformed index entry")
	}
	return int64(binary.BigEndian.Uint64(v)), gen, nil
}

// idDrops is a group's drops of its ids, as look-ups apply them: gen is the
// number of drops so far (the generation the group stores ids in now), and
// points the highest bucket dropped after each generation, as a staircase:
// generations ascending, buckets descending, the first point above a
// generation giving the highest drop after it. With drops that only rise,
// as the node's do, it is one point.
type idDrops struct {
	gen    uint64
	points []dropPoint
}

type dropPoint struct {
	gen    uint64
	bucket int64
}

// dropped reports whether an id of bucket, stored in generation gen, was
// dropped since.
func (d idDrops) dropped(bucket int64, gen uint64) bool {
	for _, p := range d.points {
		if p.gen > gen {
			return p.bucket > bucket
		}
	}
	return false
}

// add returns the drops after one more, below bucket.
func (d idDrops) add(bucket int64) idDrops {
	points := slices.Clone(d.points)
	for len(points) > 0 && points[len(points)-1].bucket <= bucket {
		points = points[:len(points)-1]
	}
	return idDrops{gen: d.gen + 1, points: append(points, dropPoint{d.gen + 1, bucket})}
}

// append appends d's stored form: uvarints, gen, the number of points,
// and each point's generation and bucket.
func (d idDrops) append(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, d.gen)
	dst = binary.AppendUvarint(dst, uint64(len(d.points)))
	for _, p := range d.points {
		dst = binary.AppendUvarint(binary.AppendUvarint(dst, p.gen), uint64(p.bucket))
	}
	return dst
}

var errIDDrops = errors.New("malformed id drops")

// decodeIDDrops decodes append's form, refusing a staircase out of order.
func decodeIDDrops(b []byte) (idDrops, error) {
	r := uvarintReader{b: b}
	d := idDrops{gen: r.next()}
	n := r.next()
	if r.bad || n > uint64(len(r.b))/2 {
		return idDrops{}, errIDDrops
	}
	d.points = make([]dropPoint, n)
	for i := range d.points {
		p := dropPoint{gen: r.next(), bucket: int64(r.next())}
		if p.bucket < 0 || p.gen > d.gen || i > 0 && (p.gen <= d.points[i-1].gen || p.bucket >= d.points[i-1].bucket) {
			r.bad = true
		}
		d.points[i] = p
	}
	if r.bad || len(r.b) != 0 {
		return idDrops{}, errIDDrops
	}
	return d, nil
}

// uvarintReader reads uvarints until one is malformed (bad).
type uvarintReader struct {
	b   []byte
	bad bool
}

func (r *uvarintReader) next() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

// varint reads a zigzag varint (binary.AppendVarint's form).
func (r *uvarintReader) varint() int64 {
	u := r.next()
	if u&1 != 0 {
		return ^int64(u >> 1)
	}
	return int64(u >> 1)
}

func (r *uvarintReader) str() string {
	n := r.next()
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// indexedIDGroupKey appends the first key of a group's ids in a bucket.
func indexedIDGroupKey(dst []byte, bucket int64, group uint32) []byte {
	dst = binary.BigEndian.AppendUint64(append(dst, kindIndexedID), uint64(bucket))
	return binary.BigEndian.AppendUint32(dst, group)
}

// appendIndexedIDKey appends the key of an id in the index; the key is
// length-prefixed, so that no key's ids are a prefix of another's.
func appendIndexedIDKey(dst []byte, bucket int64, group uint32, key, id string) []byte {
	dst = indexedIDGroupKey(dst, bucket, group)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(key)))
	return append(append(dst, key...), id...)
}

func idHeldKey(bucket int64, group uint32) []byte {
	k := binary.BigEndian.AppendUint64([]byte{kindIDHeld}, uint64(bucket))
	return binary.BigEndian.AppendUint32(k, group)
}

func pendingIDsKey(group uint32) []byte { return groupKey(kindPendingIDs, group, 0) }
func idDropsKey(group uint32) []byte    { return groupKey(kindIDDrops, group, 0) }

// appendPendingIDs appends the pending form of a checkpoint's ids (see
// idIndex): the drop generation they are stored in, their number, and
// each id's bucket, key, id, At and Expires (uvarints; At and Expires
// varints), strings length-prefixed.
func appendPendingIDs(dst []byte, gen uint64, ids []persistence.StoredID) []byte {
	dst = binary.AppendUvarint(dst, gen)
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		dst = binary.AppendUvarint(dst, uint64(id.Bucket))
		dst = binary.AppendUvarint(dst, uint64(len(id.Key)))
		dst = append(dst, id.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(id.ID)))
		dst = append(dst, id.ID...)
		dst = binary.AppendVarint(dst, id.At)
		dst = binary.AppendVarint(dst, id.Expires)
	}
	return dst
}

// pendingIDsSize is the length of appendPendingIDs's form.
func pendingIDsSize(gen uint64, ids []persistence.StoredID) int {
	n := protowire.SizeVarint(gen) + protowire.SizeVarint(uint64(len(ids)))
	for _, id := range ids {
		n += protowire.SizeVarint(uint64(id.Bucket)) +
			protowire.SizeVarint(uint64(len(id.Key))) + len(id.Key) +
			protowire.SizeVarint(uint64(len(id.ID))) + len(id.ID) +
			protowire.SizeVarint(protowire.EncodeZigZag(id.At)) +
			protowire.SizeVarint(protowire.EncodeZigZag(id.Expires))
	}
	return n
}

var errPendingIDs = errors.New("malformed pending ids")

// decodePendingIDs decodes appendPendingIDs's form. It refuses what that
// cannot have written (a count beyond the bytes, a negative bucket,
// trailing bytes), and allocates no more than the input's size allows.
func decodePendingIDs(b []byte) (gen uint64, ids []persistence.StoredID, err error) {
	r := uvarintReader{b: b}
	gen = r.next()
	count := r.next()
	// An id takes at least five bytes.
	if r.bad || count > uint64(len(r.b))/5 {
		return 0, nil, errPendingIDs
	}
	ids = make([]persistence.StoredID, count)
	for i := range ids {
		id := &ids[i]
		id.Bucket = int64(r.next())
		id.Key = r.str()
		id.ID = r.str()
		id.At = r.varint()
		id.Expires = r.varint()
		if id.Bucket < 0 {
			r.bad = true
		}
		if r.bad {
			return 0, nil, errPendingIDs
		}
	}
	if len(r.b) != 0 {
		return 0, nil, errPendingIDs
	}
	return gen, ids, nil
}
