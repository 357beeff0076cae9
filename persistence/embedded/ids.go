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
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/keyfold/keyfold/persistence"
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
// flushed once into a level 0 table, which stays there until every group
// dropped the bucket it is in; then the tables below that bucket are cut
// out whole (DB.Excise), nothing rewritten. Its keys are bucket first, so
// that a look-up consults only the few tables flushed while its bucket
// was current (their Bloom filters), and the buckets that passed are one
// span:
//
//	'j' bucket:8 group:4 len:4 key id   an id, under its time bucket; the
//	                                    value is when its key applied it
//	                                    (int64 Unix ms)
//	'g' bucket:8 group:4                the group holds ids in the bucket;
//	                                    the value is the latest Expires of
//	                                    those ids (int64 Unix ms;
//	                                    math.MaxInt64: never)
//
// A group's drop (CheckpointData.DropIDsBefore) is a range deletion of its
// ids in each bucket below the drop that holds some ('g' says which), so
// that ids stored later in those buckets are held again, as the contract
// says. The index keeps the 'g' entries in memory too (idIndex.held):
// what a drop deletes and what the sweep may cut out are decided there.
//
// The two Pebbles commit apart, so the checkpoint's batch in the store's
// Pebble holds the checkpoint's ids and drop as one pending entry ('n'
// group, keys.go), committed with its snapshots; the index is written
// after it (synced), and the pending entry deleted. A crash or a failed
// write in between leaves the entry: every opening of the store writes the
// pending entries into the index before it takes a call, so that the index
// holds what every committed checkpoint stored. A group's look-ups wait
// while its checkpoint is between the two commits (group.ids), so that a
// key's ids are found from the moment its snapshot can be read, as with
// one batch.
type idIndex struct {
	db *pebble.DB
	// gate orders writes against the sweep: a write holds it shared from
	// the moment it records its buckets in held until its batch is
	// committed, the sweep exclusively, so that it never cuts out ids a
	// write is committing into a bucket it took for empty.
	gate sync.RWMutex
	mu   sync.Mutex
	// held is the 'g' entries: bucket → group → latest Expires.
	held map[int64]map[uint32]int64
	// cut is the bucket below which the index was cut out since it opened
	// (0: not yet); under mu.
	cut int64
}

const (
	idsDir = "ids" // the index's Pebble, under the store's directory

	kindIndexedID = 'j'
	kindIDHeld    = 'g'

	// IDIndexCacheSize is the index's block cache: look-ups are rare, and read
	// the filters and index blocks of the few tables of their bucket.
	IDIndexCacheSize = 32 << 20
)

// idsOptions returns the index's Pebble options: the store's (its
// filesystem, logger and listeners, so that a failed WAL write or a full
// disk fails and reopens the store as the store's own Pebble does), with
// compactions off and level 0 unbounded.
func (s *Store) idsOptions() *pebble.Options {
	po := s.opts.pebbleOptions(s)
	po.CacheSize = IDIndexCacheSize
	po.DisableAutomaticCompactions = true
	po.L0CompactionThreshold = math.MaxInt32
	po.L0CompactionFileThreshold = math.MaxInt32
	po.L0StopWritesThreshold = math.MaxInt32
	po.Experimental.LevelMultiplier = 0 // Pebble's default: no level but 0 is used
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	return po
}

// openIndex opens the id index, writes into it the checkpoints' pending
// ids that db holds (see idIndex), and reports whether db holds ids of the
// index an older format kept there.
func (s *Store) openIndex(db *pebble.DB) (*idIndex, bool, error) {
	x, err := s.openIDs(db)
	if err != nil {
		return nil, false, err
	}
	var legacy bool
	err = s.inPebble(func() error {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindID}, UpperBound: []byte{kindID + 1}})
		if err != nil {
			return err
		}
		legacy = it.First()
		return it.Close()
	})
	if err != nil {
		_ = s.inPebble(x.db.Close)
		return nil, false, fmt.Errorf("id index of an older format: %w", err)
	}
	return x, legacy, nil
}

// indexIDs writes a committed checkpoint's drop and ids into the id index
// and deletes their pending entry; after a drop it sweeps the index. A
// failed write fails the store, whose reopening writes the pending entry.
func (s *Store) indexIDs(group uint32, drop int64, ids []persistence.StoredID) error {
	if err := s.write(func() error { return s.ids.write(group, drop, ids) }); err != nil {
		if !errors.Is(err, ErrFailed) {
			err = s.fail(fmt.Errorf("id index: %w", err))
		}
		return err
	}
	// Not synced: a pending entry found at the next opening is the
	// group's last checkpoint's, and writing it again changes nothing.
	if err := s.write(func() error { return s.db.Delete(pendingIDsKey(group), pebble.NoSync) }); err != nil {
		return err
	}
	if drop > 0 {
		if err := s.inPebble(func() error { return s.ids.sweep(nowMs()) }); err != nil {
			s.limitedError("id index: sweeping the dropped buckets failed (retried at the next drop)", err)
		}
	}
	return nil
}

// openIDs opens the id index and writes into it the checkpoints' pending
// ids that db holds (see idIndex).
func (s *Store) openIDs(db *pebble.DB) (*idIndex, error) {
	dir := s.opts.fs.PathJoin(s.dir, idsDir)
	if err := s.opts.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("id index: %w", describeDirError(err))
	}
	idb, err := s.openPebble(dir, s.idsOptions())
	if err != nil {
		return nil, fmt.Errorf("id index: %w", err)
	}
	x := &idIndex{db: idb, held: map[int64]map[uint32]int64{}}
	if err := s.inPebble(x.load); err != nil {
		_ = s.inPebble(idb.Close)
		return nil, fmt.Errorf("id index: %w", err)
	}
	if err := s.replayPendingIDs(db, x); err != nil {
		_ = s.inPebble(idb.Close)
		return nil, fmt.Errorf("id index: %w", err)
	}
	return x, nil
}

// load reads the 'g' entries into held.
func (x *idIndex) load() error {
	it, err := x.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindIDHeld}, UpperBound: []byte{kindIDHeld + 1}})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		if len(k) != 1+8+4 {
			_ = it.Close()
			return fmt.Errorf("malformed entry %q", k)
		}
		v, err := it.ValueAndErr()
		var exp uint64
		if err == nil {
			exp, err = decodeUint64(v)
		}
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("entry %q: %w", k, err)
		}
		x.hold(int64(binary.BigEndian.Uint64(k[1:])), binary.BigEndian.Uint32(k[9:]), int64(exp))
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
	b := db.NewBatch()
	defer b.Close()
	for _, p := range ps {
		drop, ids, err := decodePendingIDs(p.data)
		if err != nil {
			return fmt.Errorf("pending ids of group %d: %w", p.group, err)
		}
		if err := s.inPebble(func() error { return x.write(p.group, drop, ids) }); err != nil {
			return fmt.Errorf("pending ids of group %d: %w", p.group, err)
		}
		_ = b.Delete(pendingIDsKey(p.group), nil)
	}
	if err := s.inPebble(func() error { return b.Commit(pebble.Sync) }); err != nil {
		return err
	}
	s.log.Info("id index: wrote the ids of checkpoints a crash or a failed write left pending", "dir", s.dir, "groups", len(ps))
	return nil
}

// write stores a checkpoint's drop and ids (synced): the group's ids in
// the buckets below drop (if positive) are deleted first. It calls Pebble
// directly: callers run it in inPebble or Store.write.
func (x *idIndex) write(group uint32, drop int64, ids []persistence.StoredID) error {
	b := x.db.NewBatch()
	defer b.Close()
	x.gate.RLock()
	defer x.gate.RUnlock()

	// What the batch deletes and holds, decided under mu and recorded
	// before the commit: held may name buckets a failed commit did not
	// fill (a sweep keeps them a while longer), never miss one it did.
	x.mu.Lock()
	var dropped []int64
	if drop > 0 {
		for bucket, gs := range x.held {
			if _, ok := gs[group]; ok && bucket < drop {
				dropped = append(dropped, bucket)
			}
		}
	}
	type bucketExp struct {
		bucket, expires int64
	}
	var latest []bucketExp // ids come a bucket at a time: a short list
	for _, id := range ids {
		exp := id.Expires
		if exp <= 0 {
			exp = math.MaxInt64
		}
		i := slices.IndexFunc(latest, func(e bucketExp) bool { return e.bucket == id.Bucket })
		if i < 0 {
			latest = append(latest, bucketExp{id.Bucket, exp})
		} else {
			latest[i].expires = max(latest[i].expires, exp)
		}
	}
	heldNow := make([]bucketExp, 0, len(latest))
	for _, e := range latest {
		x.hold(e.bucket, group, e.expires)
		heldNow = append(heldNow, bucketExp{e.bucket, x.held[e.bucket][group]})
	}
	x.mu.Unlock()

	for _, bucket := range dropped {
		lo := indexedIDGroupKey(nil, bucket, group)
		var hi []byte
		if group == math.MaxUint32 {
			hi = indexedIDGroupKey(nil, bucket+1, 0)
		} else {
			hi = indexedIDGroupKey(nil, bucket, group+1)
		}
		if err := b.DeleteRange(lo, hi, nil); err != nil {
			return err
		}
		if err := b.Delete(idHeldKey(bucket, group), nil); err != nil {
			return err
		}
	}
	var kb []byte
	var at [8]byte
	for _, id := range ids {
		kb = appendIndexedIDKey(kb[:0], id.Bucket, group, id.Key, id.ID)
		binary.BigEndian.PutUint64(at[:], uint64(id.At))
		if err := b.Set(kb, at[:], nil); err != nil {
			return err
		}
	}
	for _, e := range heldNow {
		binary.BigEndian.PutUint64(at[:], uint64(e.expires))
		if err := b.Set(idHeldKey(e.bucket, group), at[:], nil); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return err
	}
	if len(dropped) > 0 {
		x.mu.Lock()
		for _, bucket := range dropped {
			if gs := x.held[bucket]; gs != nil && !slices.ContainsFunc(heldNow, func(e bucketExp) bool { return e.bucket == bucket }) {
				delete(gs, group)
				if len(gs) == 0 {
					delete(x.held, bucket)
				}
			}
		}
		x.mu.Unlock()
	}
	return nil
}

// sweep cuts out of the index the buckets below the lowest one any group
// holds ids in, once that rose (a group holds none in a bucket it dropped,
// or where all its ids expired, now being Unix ms): their tables are
// removed whole, or cut down to what lies above (Pebble makes virtual
// tables of those; nothing is rewritten). An excise of a span the memtable
// overlaps (the drops' range deletions) is applied to the tables at its
// flush. It calls Pebble directly: the caller runs it in inPebble.
func (x *idIndex) sweep(now int64) error {
	if low, err := x.lowHeld(now); err != nil || low <= x.loadCut() {
		return err
	}
	x.gate.Lock()
	defer x.gate.Unlock()
	low, err := x.lowHeld(now) // again: no write is between its two steps now
	if err != nil || low <= x.loadCut() {
		return err
	}
	end := []byte{kindIndexedID + 1} // no group holds any: all of it
	if low != math.MaxInt64 {
		end = indexedIDGroupKey(nil, low, 0)
	}
	if err := x.db.Excise(context.Background(), pebble.KeyRange{Start: []byte{kindIndexedID}, End: end}); err != nil {
		return err
	}
	x.mu.Lock()
	x.cut = low
	x.mu.Unlock()
	return nil
}

func (x *idIndex) loadCut() int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cut
}

// lowHeld returns the lowest bucket any group holds ids in (math.MaxInt64:
// none), after forgetting (and deleting the 'g' entries of) the groups
// whose ids there all expired by now, in that bucket and those below. It
// looks at the buckets from the lowest up to the first held: a few a
// sweep, however many groups and buckets the index holds.
func (x *idIndex) lowHeld(now int64) (int64, error) {
	x.mu.Lock()
	var expired [][]byte
	low := int64(math.MaxInt64)
	for _, bucket := range slices.Sorted(maps.Keys(x.held)) {
		gs := x.held[bucket]
		for g, exp := range gs {
			if exp < now {
				delete(gs, g)
				expired = append(expired, idHeldKey(bucket, g))
			}
		}
		if len(gs) > 0 {
			low = bucket
			break
		}
		delete(x.held, bucket)
	}
	x.mu.Unlock()
	if len(expired) == 0 {
		return low, nil
	}
	b := x.db.NewBatch()
	defer b.Close()
	for _, k := range expired {
		_ = b.Delete(k, nil)
	}
	// Not synced: an expired entry found again at the next opening is
	// forgotten again.
	return low, b.Commit(pebble.NoSync)
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

// appendPendingIDs appends the pending form of a checkpoint's drop and ids
// (see idIndex): the drop, the number of ids, and each id's bucket, key,
// id, At and Expires, integers as uvarints, strings length-prefixed.
func appendPendingIDs(dst []byte, drop int64, ids []persistence.StoredID) []byte {
	dst = binary.AppendUvarint(dst, uint64(drop))
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	for _, id := range ids {
		dst = binary.AppendUvarint(dst, uint64(id.Bucket))
		dst = binary.AppendUvarint(dst, uint64(len(id.Key)))
		dst = append(dst, id.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(id.ID)))
		dst = append(dst, id.ID...)
		dst = binary.AppendUvarint(dst, uint64(id.At))
		dst = binary.AppendUvarint(dst, uint64(id.Expires))
	}
	return dst
}

var errPendingIDs = errors.New("malformed pending ids")

// decodePendingIDs decodes appendPendingIDs's form. It refuses what that
// cannot have written (a count beyond the bytes, a negative number,
// trailing bytes), and allocates no more than the input's size allows.
func decodePendingIDs(b []byte) (drop int64, ids []persistence.StoredID, err error) {
	next := func() (int64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > math.MaxInt64 {
			return 0, false
		}
		b = b[n:]
		return int64(v), true
	}
	str := func() (string, bool) {
		n, ok := next()
		if !ok || n > int64(len(b)) {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	drop, ok := next()
	count, ok2 := next()
	// An id takes at least five bytes.
	if !ok || !ok2 || count > int64(len(b))/5 {
		return 0, nil, errPendingIDs
	}
	ids = make([]persistence.StoredID, count)
	for i := range ids {
		id := &ids[i]
		var ok [5]bool
		id.Bucket, ok[0] = next()
		id.Key, ok[1] = str()
		id.ID, ok[2] = str()
		id.At, ok[3] = next()
		id.Expires, ok[4] = next()
		if ok != [5]bool{true, true, true, true, true} {
			return 0, nil, errPendingIDs
		}
	}
	if len(b) != 0 {
		return 0, nil, errPendingIDs
	}
	return drop, ids, nil
}

// lookUp sets at[i] to the time the index holds lookups[i] with, where it
// holds it (leaving the others), from one view of the index.
func (x *idIndex) lookUp(group uint32, lookups []persistence.IDLookup, at []int64, stop func() error) error {
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
		var u uint64
		if ok {
			u, err = decodeUint64(v)
		}
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("id %q of key %q: %w", l.ID, l.Key, err)
		}
		if ok {
			at[i] = int64(u)
		}
	}
	return it.Close()
}

// nowMs is the clock the sweep's expiry reads (Unix ms).
func nowMs() int64 { return time.Now().UnixMilli() }
