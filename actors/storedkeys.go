package actors

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/keyfold/keyfold/persistence"
)

// A group's filter of stored keys: a key it does not hold has no snapshot,
// so activating it needs no store read.
//
// A key that is neither in memory, spilled nor in the snapshot cache was
// read from the store (activate.go), also when it had never been seen: at
// three million first-time keys those reads of nothing were 8.5 of 29.5 µs
// of an event (BENCHMARKS.md, session 23), and groupState.complete could
// only tell a group that was never checkpointed. Now each group keeps a
// Bloom filter of the keys its checkpoints wrote. A checkpoint adds the keys
// it writes before it writes them, and writes the layers of the filter that
// changed in the same atomic store write as the snapshots (as the group's
// clock is): the filter in the store always holds every key whose snapshot
// the store has. A take-over reads it (two reads per group, the header and
// its layers: the recovery stays independent of the number of keys). A key the filter does
// not hold loads as new; a false positive (about 0.4% of the keys a full
// layer, up to 3% at ten million keys, and keys erased since) is read as
// before.
//
// Why nothing is lost: a snapshot is written only by a checkpoint
// (checkpointGroup, whether the loop's, a release's or the shutdown's), and
// the checkpoint adds the keys of its snapshots first. A checkpoint that
// fails leaves keys in the filter that the store does not have: harmless.
// A group whose store has no filter (written by an older keyfold) has none
// here either (nil: every key may be stored, read as before); one that was
// never checkpointed starts with an empty one. The filter's header names the
// checkpoint position it was written at, and a take-over uses it only if
// that is the group's position: a keyfold without the filter (in a rolling
// upgrade, or after a downgrade) moves the position as it stores keys the
// filter does not hold (TestKeysStoredWithoutTheFilterAreRead).
//
// Keys are never taken out (an erased key stays, a harmless false
// positive): the filter follows the keys a group ever stored. At 32 layers
// (~490k keys a group, ~125M with the default 256 groups) it is dropped,
// in memory and in the store, and the group's keys are read as before.
//
// The filter grows in layers, so that a checkpoint writes only the layer
// keys are added to: 1,024 keys, then twice as many up to 16,384 a layer,
// 12 bits a key (1.5 B: 15 MB at ten million keys), in blocks of one cache
// line (a look-up touches one line a layer). The words are read and set
// atomically: a commit's prefetch (off h.mu) and activations look keys up
// while a checkpoint of the group adds its keys (a group's checkpoints run
// one at a time).

const (
	filterFirstLayer = 1 << 10
	filterMaxLayer   = 1 << 14
	filterBitsPerKey = 12
	filterProbes     = 7 // of 9 bits each, from one 64-bit hash
	filterBlockWords = 8 // 512 bits
	filterVersion    = 1
	// storedKeysKey names the filter's header among the group's snapshots,
	// storedKeysKey+"/"+layer its layers (like groupClockKey, a name no
	// key's snapshot can have).
	storedKeysKey = "\x00keys"
	// maxFilterLayers bounds a group's filter: 32 layers hold ~490k keys
	// (a look-up of a key it does not hold then touches 32 cache lines, and
	// ~12% of them are false positives). A group that stores more keys
	// drops its filter (full): its keys are read as before.
	maxFilterLayers = 32
	headerFull      = 1 // the header's flag: the group outgrew its filter
)

// storedKeys is a group's filter. A nil *storedKeys holds every key, as
// does a full one.
type storedKeys struct {
	layers atomic.Pointer[[]*filterLayer]
	full   atomic.Bool
	// The rest is its checkpoints' (one at a time): how many keys each
	// layer was given, which changed since the store last had them, and
	// how many layers the store has that a full filter is to delete.
	counts  []int
	unsaved []bool
	drop    int
}

type filterLayer struct {
	words    []uint64 // blocks of filterBlockWords
	capacity int
}

func layerCapacity(i int) int { return min(filterFirstLayer<<min(i, 30), filterMaxLayer) }

func newFilterLayer(capacity int) *filterLayer {
	blocks := (capacity*filterBitsPerKey + 511) / 512
	return &filterLayer{words: make([]uint64, blocks*filterBlockWords), capacity: capacity}
}

func newStoredKeys() *storedKeys {
	f := &storedKeys{}
	f.layers.Store(new([]*filterLayer))
	return f
}

// hashKey is the filter's hash of a key's snapshot name,
// xxhash.Sum64String(id.snapshotKey()), without making the name. It is
// stored (in the filter's bits): it must not change.
func hashKey(id keyID) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(id.pipeline)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(id.key)
	return d.Sum64()
}

// probes returns where the key's probes are in layer l: the first word of
// its block, and the bits that place them in the block (9 each).
func (l *filterLayer) probes(h uint64) (block int, places uint64) {
	blocks := uint64(len(l.words) / filterBlockWords)
	block = int((h>>32)*blocks>>32) * filterBlockWords
	// (murmur3's finaliser: the key's bits in the block independent of
	// which block.)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return block, h
}

func (l *filterLayer) has(h uint64) bool {
	block, places := l.probes(h)
	for range filterProbes {
		b := places & 511
		if atomic.LoadUint64(&l.words[block+int(b>>6)])&(1<<(b&63)) == 0 {
			return false
		}
		places >>= 9
	}
	return true
}

func (l *filterLayer) set(h uint64) {
	block, places := l.probes(h)
	for range filterProbes {
		b := places & 511
		atomic.OrUint64(&l.words[block+int(b>>6)], 1<<(b&63))
		places >>= 9
	}
}

// mayHave reports whether the key may have a snapshot in the store.
func (f *storedKeys) mayHave(id keyID) bool {
	if f == nil || f.full.Load() {
		return true
	}
	layers := *f.layers.Load()
	if len(layers) == 0 {
		return false
	}
	return holds(layers, hashKey(id))
}

// holds reports whether a layer holds the hash. It looks from the last,
// largest layers, which hold most keys: a stored key is found in a probe
// or two (a key not held costs a cache line a layer whatever the order).
func holds(layers []*filterLayer, h uint64) bool {
	for i := len(layers) - 1; i >= 0; i-- {
		if layers[i].has(h) {
			return true
		}
	}
	return false
}

// add records that the key whose snapshot name (isKeySnapshot) is given is
// about to be written. Only a checkpoint of the group calls it.
func (f *storedKeys) add(name string) {
	if f.full.Load() {
		return
	}
	h := xxhash.Sum64String(name) // hashKey of its key
	layers := *f.layers.Load()
	if holds(layers, h) {
		return
	}
	n := len(layers)
	if n == maxFilterLayers && f.counts[n-1] >= layers[n-1].capacity {
		f.full.Store(true) // (read first: a look-up sees the key held)
		f.layers.Store(new([]*filterLayer))
		f.drop, f.counts, f.unsaved = n, nil, nil
		return
	}
	if n == 0 || f.counts[n-1] >= layers[n-1].capacity {
		grown := append(layers[:n:n], newFilterLayer(layerCapacity(n)))
		f.counts, f.unsaved = append(f.counts, 0), append(f.unsaved, false)
		f.layers.Store(&grown)
		layers, n = grown, n+1
	}
	layers[n-1].set(h)
	f.counts[n-1]++
	f.unsaved[n-1] = true
}

// isKeySnapshot reports whether a snapshot name is a key's state
// (id.snapshotKey()): not a group's record (a leading NUL) nor a part of a
// key's remembered ids (a second NUL, bucketKey).
func isKeySnapshot(name string) bool {
	i := strings.IndexByte(name, 0)
	return i > 0 && strings.IndexByte(name[i+1:], 0) < 0
}

// addWritten adds the keys whose state d writes, and then the layers that
// changed and the header to d; at is the group's checkpoint position once
// d is stored. It returns the layers it wrote, for saved.
//
// The header names that position, and a take-over uses the filter only if
// it is the group's: a keyfold without the filter (an older one, in a
// rolling upgrade or after a downgrade) writes snapshots without adding
// them, but it moves the position, so its snapshots are never hidden by a
// filter it did not keep. (So the header is written by every checkpoint.)
func (f *storedKeys) addWritten(d *persistence.CheckpointData, at persistence.Position) []int {
	if f == nil {
		return nil
	}
	for _, s := range d.Snapshots {
		if s.Data != nil && isKeySnapshot(s.Key) {
			f.add(s.Key)
		}
	}
	var wrote []int
	layers := *f.layers.Load()
	for i, l := range layers {
		if f.unsaved[i] {
			d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: filterLayerKey(i), Data: l.encode(f.counts[i])})
			wrote = append(wrote, i)
		}
	}
	flags := byte(0)
	if f.full.Load() {
		flags = headerFull
		for i := range f.drop {
			d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: filterLayerKey(i)}) // deleted
		}
	}
	hdr := binary.AppendUvarint([]byte{filterVersion, flags}, at)
	hdr = binary.AppendUvarint(hdr, uint64(len(layers)))
	d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: storedKeysKey, Data: hdr})
	return wrote
}

// saved records that what addWritten added to a checkpoint is stored.
func (f *storedKeys) saved(layers []int) {
	if f == nil {
		return
	}
	if f.full.Load() {
		f.drop = 0
		return
	}
	for _, i := range layers {
		f.unsaved[i] = false
	}
}

// bytes is the filter's memory.
func (f *storedKeys) bytes() int64 {
	if f == nil {
		return 0
	}
	var n int64
	for _, l := range *f.layers.Load() {
		n += int64(len(l.words)) * 8
	}
	return n
}

func filterLayerKey(i int) string { return storedKeysKey + "/" + strconv.Itoa(i) }

// encode is a layer as stored: version, capacity, keys added, words.
func (l *filterLayer) encode(count int) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64+8*len(l.words))
	b = append(b, filterVersion)
	b = binary.AppendUvarint(b, uint64(l.capacity))
	b = binary.AppendUvarint(b, uint64(count))
	for i := range l.words {
		b = binary.LittleEndian.AppendUint64(b, atomic.LoadUint64(&l.words[i]))
	}
	return b
}

var errFilter = errors.New("stored keys' filter does not decode")

// decodeLayer decodes a layer that encode wrote as layer i.
func decodeLayer(i int, b []byte) (*filterLayer, int, error) {
	if len(b) < 1 || b[0] != filterVersion {
		return nil, 0, fmt.Errorf("%w: layer %d: unknown version", errFilter, i)
	}
	capacity, b, ok := uvarint(b[1:])
	if !ok || capacity != uint64(layerCapacity(i)) {
		return nil, 0, fmt.Errorf("%w: layer %d: capacity", errFilter, i)
	}
	count, b, ok := uvarint(b)
	if !ok || count > capacity {
		return nil, 0, fmt.Errorf("%w: layer %d: count", errFilter, i)
	}
	l := newFilterLayer(int(capacity))
	if len(b) != 8*len(l.words) {
		return nil, 0, fmt.Errorf("%w: layer %d: %d bytes of words, want %d", errFilter, i, len(b), 8*len(l.words))
	}
	for w := range l.words {
		l.words[w] = binary.LittleEndian.Uint64(b[8*w:])
	}
	return l, int(count), nil
}

// uvarint decodes a varint as binary.AppendUvarint encodes it (no longer),
// and returns the rest of b.
func uvarint(b []byte) (uint64, []byte, bool) {
	v, n := binary.Uvarint(b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
		return 0, nil, false
	}
	return v, b[n:], true
}

// errStaleFilter: the group's filter is not of its last checkpoint.
var errStaleFilter = errors.New("the stored keys' filter was written before the group's last checkpoint (by a keyfold without the filter?)")

// loadStoredKeys reads group g's filter after a claim of it (checkpoint is
// the group's checkpoint position). It returns nil (every key may be
// stored) for a group that outgrew its filter, or that was checkpointed by
// a keyfold that kept none: with no header, or with errStaleFilter. A
// filter that does not decode is an error wrapping errFilter.
func loadStoredKeys(ctx context.Context, store persistence.Snapshots, g uint32, checkpoint persistence.Position) (*storedKeys, error) {
	hdr, err := store.Get(ctx, g, storedKeysKey)
	if errors.Is(err, persistence.ErrNotFound) {
		if checkpoint == 0 {
			return newStoredKeys(), nil // never checkpointed: nothing stored
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(hdr) < 2 || hdr[0] != filterVersion || hdr[1]&^headerFull != 0 {
		return nil, fmt.Errorf("%w: header: unknown version or flags", errFilter)
	}
	at, rest, ok := uvarint(hdr[2:])
	var count uint64
	if ok {
		count, rest, ok = uvarint(rest)
	}
	if !ok || len(rest) != 0 || count > maxFilterLayers {
		return nil, fmt.Errorf("%w: header", errFilter)
	}
	if at != checkpoint {
		return nil, fmt.Errorf("%w (filter at %d, checkpoint at %d)", errStaleFilter, at, checkpoint)
	}
	if hdr[1]&headerFull != 0 {
		return nil, nil
	}
	names := make([]string, count)
	for i := range names {
		names[i] = filterLayerKey(i)
	}
	datas, err := store.GetMany(ctx, g, names)
	if err != nil {
		return nil, err
	}
	f := &storedKeys{counts: make([]int, count), unsaved: make([]bool, count)}
	layers := make([]*filterLayer, count)
	for i, data := range datas {
		if data == nil {
			return nil, fmt.Errorf("%w: layer %d is missing", errFilter, i)
		}
		if layers[i], f.counts[i], err = decodeLayer(i, data); err != nil {
			return nil, err
		}
	}
	f.layers.Store(&layers)
	return f, nil
}
