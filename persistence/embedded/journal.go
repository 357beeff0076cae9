package embedded

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/keyfold/keyfold/persistence"
)

// The log of the key groups, outside Pebble.
//
// Records are appended to segment files in the store's log/ directory, one
// write and one fdatasync per Append whatever the number of groups (the
// group commit), instead of going through Pebble's WAL, memtable, flushes
// and compactions only to be deleted by the next checkpoint: that path cost
// Pebble ~2.3 µs per event at 10k keys and ~5.7 at 1M, some 10-15% of the
// node (BENCHMARKS.md, session 20). Snapshots, checkpoint positions, epochs,
// timers and outputs stay in Pebble.
//
// A segment is a sequence of frames, one per Append, each a sequence of
// blocks, one per group, each holding consecutive records of the group:
//
//	frame: crc:4 length:4 blocks:4  block…
//	block: crc:4 length:4 group:4 first:8 count:4  record…
//
// A block's crc is the CRC-32C (Castagnoli) of everything after it, so a
// read of one group checks its blocks alone; a frame's is that of its
// length and count and then of its blocks' crcs, so that the recovery scan
// keeps an Append whole or drops it whole (a kill can cut a large write
// short): a batch of events that spans groups is in the log entirely or not
// at all, as it was in Pebble. Lengths include the headers; first is the
// position of the first of count records, each a uvarint length then the
// data. Integers are little-endian.
//
// A segment is written by one process only, from its creation, and never
// again after the next one is created (Open starts a new one, whatever the
// last one holds): the previous one is synced before the next is created,
// and the directory is synced after a creation, before anything written in
// the new segment is acknowledged. So only the last segment can end with a
// torn block (an unsynced write cut by a crash, or a failed write); Open
// cuts it at its last whole block (ftruncate), and a bad block
// anywhere else is corruption: Open refuses the store rather than lose the
// acknowledged records after it.
//
// A segment is deleted once every group with records in it has
// checkpointed through them (the checkpoint's trim). A deletion lost in a
// crash leaves a segment of records at or below their checkpoints, which
// Open deletes again. The journal keeps an index in memory: per group, the
// place of each of its blocks above its checkpoint (one entry per group per
// Append, dropped by the group's next checkpoint), so that Read of one group
// reads only its own blocks.

const (
	segmentDir         = "log"
	segmentSuffix      = ".seg"
	frameHeaderLen     = 4 + 4 + 4
	blockHeaderLen     = 4 + 4 + 4 + 8 + 4
	maxFrameLen        = 1 << 30
	maxBlockLen        = maxFrameLen - frameHeaderLen
	defaultSegmentSize = 64 << 20
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errCorruptLog reports a log the journal cannot read without losing
// records.
var errCorruptLog = errors.New("corrupt log")

// journal is the set of log segments. It is safe for concurrent use; calls
// that write one group must not overlap (the store holds the group's lock).
type journal struct {
	fs          vfs.FS
	dir         string
	segmentSize int64

	mu      sync.Mutex
	segs    []*segment // ascending; the last one is written
	written uint64     // bytes written since open, all segments
	groups  map[uint32]*groupLog
	err     error // the first failed write or sync: every later write fails

	syncMu sync.Mutex    // one fdatasync at a time; the others wait and share it
	synced atomic.Uint64 // written, as of the last sync that covered it
}

// segment is one segment file.
type segment struct {
	seq     uint64
	name    string
	f       vfs.File
	size    int64
	durable int64                           // the bytes known to be synced
	groups  map[uint32]persistence.Position // per group, its last position in the segment
	refs    int                             // reads and syncs using f (under journal.mu)
	deleted bool                            // removed: f is closed when refs drops to 0
}

// groupLog is what the journal knows of one group.
type groupLog struct {
	last    persistence.Position // the last position in the log (0: none)
	trimmed persistence.Position // the group's checkpoint, as far as the journal was told
	blocks  []blockRef           // the blocks with records above trimmed, in position order
}

// blockRef places one block.
type blockRef struct {
	seg  *segment
	off  int64
	len  uint32
	last persistence.Position
}

// pendingBlock is a block of an Append's buffer.
type pendingBlock struct {
	group uint32
	off   int // in the buffer
	len   uint32
	last  persistence.Position
}

func segmentName(seq uint64) string { return fmt.Sprintf("%016d%s", seq, segmentSuffix) }

// openJournal opens the log in dir/log, creating it if needed. checkpoint
// returns a group's checkpoint position (records at or below it are not
// needed). It checks every block, cuts a torn tail off the last segment,
// deletes the segments every record of which is checkpointed, and starts a
// new segment.
//
// tail, if set, is what a journal that failed had synced of its last
// segment (see failedTail): the segment is cut there, since what followed
// was never acknowledged and, after a failed fdatasync, may be in the page
// cache only.
func openJournal(fs vfs.FS, dir string, segmentSize int64, tail syncedTail, checkpoint func(uint32) (persistence.Position, error)) (_ *journal, err error) {
	j := &journal{
		fs:          fs,
		dir:         fs.PathJoin(dir, segmentDir),
		segmentSize: segmentSize,
		groups:      map[uint32]*groupLog{},
	}
	if err := fs.MkdirAll(j.dir, 0o755); err != nil {
		return nil, fmt.Errorf("log directory: %w", err)
	}
	if err := syncDir(fs, dir); err != nil { // the log directory's own entry
		return nil, fmt.Errorf("log directory: %w", err)
	}
	seqs, err := j.list()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			j.close()
		}
	}()
	for i, seq := range seqs {
		if err := j.load(seq, i == len(seqs)-1, tail, checkpoint); err != nil {
			return nil, err
		}
	}
	for _, gl := range j.groups {
		gl.dropTrimmed()
	}
	j.deleteCovered()
	var next uint64 = 1
	if len(seqs) > 0 {
		next = seqs[len(seqs)-1] + 1
	}
	if err := j.create(next); err != nil {
		return nil, err
	}
	return j, nil
}

// list returns the sequence numbers of the segments in ascending order.
func (j *journal) list() ([]uint64, error) {
	names, err := j.fs.List(j.dir)
	if err != nil {
		return nil, fmt.Errorf("log directory: %w", err)
	}
	var seqs []uint64
	for _, name := range names {
		seq, err := strconv.ParseUint(strings.TrimSuffix(name, segmentSuffix), 10, 64)
		if !strings.HasSuffix(name, segmentSuffix) || err != nil || segmentName(seq) != name {
			continue // not ours
		}
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	return seqs, nil
}

// syncedTail is how much of its last segment a failed journal had synced.
type syncedTail struct {
	seq  uint64
	size int64
	ok   bool
}

// failedTail returns, if the journal failed, how much of its last segment
// it had synced.
func (j *journal) failedTail() syncedTail {
	if j == nil {
		return syncedTail{}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil || len(j.segs) == 0 {
		return syncedTail{}
	}
	seg := j.segs[len(j.segs)-1]
	return syncedTail{seq: seg.seq, size: seg.durable, ok: true}
}

// load scans a segment: it checks its blocks, indexes them and cuts a
// torn tail off the last segment (and off the one tail names).
func (j *journal) load(seq uint64, last bool, tail syncedTail, checkpoint func(uint32) (persistence.Position, error)) error {
	name := j.fs.PathJoin(j.dir, segmentName(seq))
	f, err := j.fs.Open(name)
	if err != nil {
		return fmt.Errorf("log segment: %w", err)
	}
	seg := &segment{seq: seq, name: name, f: f, groups: map[uint32]persistence.Position{}}
	j.segs = append(j.segs, seg)
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("log segment %s: %w", name, err)
	}
	if last {
		// What a killed process wrote and did not sync may still be in the
		// page cache only: it must be durable before anything that follows
		// it is acknowledged.
		if err := f.SyncData(); err != nil {
			return fmt.Errorf("log segment %s: sync: %w", name, err)
		}
	}
	fileSize, scanSize := st.Size(), st.Size()
	if tail.ok && tail.seq == seq {
		scanSize = min(scanSize, tail.size)
	}
	good, err := scanBlocks(bufio.NewReaderSize(io.NewSectionReader(f, 0, scanSize), 1<<20), scanSize,
		func(off int64, h blockHeader, records []byte) error {
			gl := j.groups[h.group]
			if gl == nil {
				cp, err := checkpoint(h.group)
				if err != nil {
					return err
				}
				gl = &groupLog{trimmed: cp}
				j.groups[h.group] = gl
			}
			last := h.first + uint64(h.count) - 1
			// Records above the checkpoint are dense, each in one block.
			if covered := max(gl.last, gl.trimmed); last > gl.trimmed && (h.first > covered+1 || h.first <= gl.last && gl.last > gl.trimmed) {
				return fmt.Errorf("%w: segment %s offset %d: group %d records %d to %d do not follow position %d", errCorruptLog, name, off, h.group, h.first, last, covered)
			}
			gl.last = max(gl.last, last)
			seg.groups[h.group] = last
			gl.blocks = append(gl.blocks, blockRef{seg: seg, off: off, len: h.len, last: last})
			return nil
		})
	seg.size, seg.durable = good, good
	switch {
	case err != nil:
		return err
	case good == fileSize:
		return nil
	case good < scanSize && !last:
		return fmt.Errorf("%w: segment %s has a bad block at offset %d of %d and is not the last one: the records after it would be lost", errCorruptLog, name, good, fileSize)
	}
	return j.cut(seg)
}

// cut cuts the segment to its first seg.size bytes, durably, with
// ftruncate (which needs no free space: a cut is what the reopen after a
// full disk does). A crash meanwhile leaves the segment whole or cut, both
// of which Open cuts again.
func (j *journal) cut(seg *segment) error {
	f, err := j.fs.OpenReadWrite(seg.name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("log segment %s: cutting its torn tail: %w", seg.name, err)
	}
	fd := f.Fd()
	if fd == vfs.InvalidFd {
		err = errors.New("the filesystem gives no file descriptor to truncate")
	} else if err = syscall.Ftruncate(int(fd), seg.size); err == nil {
		err = f.Sync()
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("log segment %s: cutting its torn tail: %w", seg.name, err)
	}
	return nil
}

// blockHeader is a decoded block header.
type blockHeader struct {
	len   uint32
	group uint32
	first persistence.Position
	count uint32
}

// decodeBlock checks a whole block (its CRC, and that its records fill it)
// and returns its header and records.
func decodeBlock(b []byte) (blockHeader, []byte, error) {
	if len(b) < blockHeaderLen {
		return blockHeader{}, nil, errors.New("short block")
	}
	h := blockHeader{
		len:   binary.LittleEndian.Uint32(b[4:]),
		group: binary.LittleEndian.Uint32(b[8:]),
		first: binary.LittleEndian.Uint64(b[12:]),
		count: binary.LittleEndian.Uint32(b[20:]),
	}
	if int(h.len) != len(b) {
		return h, nil, errors.New("block length mismatch")
	}
	if crc32.Checksum(b[4:], crcTable) != binary.LittleEndian.Uint32(b) {
		return h, nil, errors.New("block checksum mismatch")
	}
	records := b[blockHeaderLen:]
	if h.count == 0 || h.first == 0 || h.first+uint64(h.count)-1 < h.first {
		return h, nil, errors.New("bad block positions")
	}
	n, rest := uint32(0), records
	for len(rest) > 0 {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) {
			return h, nil, errors.New("bad record length")
		}
		rest = rest[k+int(l):]
		n++
	}
	if n != h.count {
		return h, nil, errors.New("block record count mismatch")
	}
	return h, records, nil
}

// scanBlocks reads the frames of a segment of size bytes from r, calling
// fn with each block of each whole frame, once the frame is checked whole.
// It returns the length of the prefix of whole frames: less than size if
// the segment ends with a torn or bad frame. fn's error ends the scan and
// is returned.
func scanBlocks(r io.Reader, size int64, fn func(off int64, h blockHeader, records []byte) error) (int64, error) {
	var (
		off    int64
		buf    []byte
		blocks []frameBlock
	)
	for off < size {
		if size-off < frameHeaderLen {
			return off, nil
		}
		buf = slices.Grow(buf[:0], frameHeaderLen)[:frameHeaderLen]
		if _, err := io.ReadFull(r, buf); err != nil {
			return off, fmt.Errorf("log: read at %d: %w", off, err)
		}
		n := binary.LittleEndian.Uint32(buf[4:])
		if n < frameHeaderLen || n > maxFrameLen || int64(n) > size-off {
			return off, nil
		}
		buf = slices.Grow(buf, int(n))[:n]
		if _, err := io.ReadFull(r, buf[frameHeaderLen:]); err != nil {
			return off, fmt.Errorf("log: read at %d: %w", off, err)
		}
		var ok bool
		if blocks, ok = decodeFrame(buf, blocks[:0]); !ok {
			return off, nil
		}
		for _, b := range blocks {
			if err := fn(off+int64(b.off), b.h, b.records); err != nil {
				return off, err
			}
		}
		off += int64(n)
	}
	return off, nil
}

// frameBlock is a block of a decoded frame.
type frameBlock struct {
	off     int // in the frame
	h       blockHeader
	records []byte
}

// decodeFrame checks a whole frame (its blocks, their number, its CRC) and
// appends its blocks to dst.
func decodeFrame(frame []byte, dst []frameBlock) ([]frameBlock, bool) {
	if len(frame) < frameHeaderLen || int(binary.LittleEndian.Uint32(frame[4:])) != len(frame) {
		return dst, false
	}
	crc := crc32.Update(0, crcTable, frame[4:frameHeaderLen])
	pos := frameHeaderLen
	for pos < len(frame) {
		if len(frame)-pos < blockHeaderLen {
			return dst, false
		}
		n := int(binary.LittleEndian.Uint32(frame[pos+4:]))
		if n < blockHeaderLen || n > len(frame)-pos {
			return dst, false
		}
		h, records, err := decodeBlock(frame[pos : pos+n])
		if err != nil {
			return dst, false
		}
		dst = append(dst, frameBlock{off: pos, h: h, records: records})
		crc = crc32.Update(crc, crcTable, frame[pos:pos+4])
		pos += n
	}
	count := binary.LittleEndian.Uint32(frame[8:])
	if count == 0 || int(count) != len(dst) || crc != binary.LittleEndian.Uint32(frame) {
		return dst, false
	}
	return dst, true
}

// create starts segment seq and makes it the one written.
func (j *journal) create(seq uint64) error {
	name := j.fs.PathJoin(j.dir, segmentName(seq))
	f, err := j.fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("log segment: %w", err)
	}
	if err := j.syncDir(); err != nil {
		_ = f.Close()
		return fmt.Errorf("log segment %s: %w", name, err)
	}
	j.segs = append(j.segs, &segment{seq: seq, name: name, f: f, groups: map[uint32]persistence.Position{}})
	return nil
}

func (j *journal) syncDir() error { return syncDir(j.fs, j.dir) }

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// last returns the group's last position in the log, 0 if it has none.
func (j *journal) last(group uint32) persistence.Position {
	j.mu.Lock()
	defer j.mu.Unlock()
	if gl := j.groups[group]; gl != nil {
		return gl.last
	}
	return 0
}

// write appends buf, which holds blocks, durably: it returns once buf is
// synced. Blocks of one group must come in position order, across calls
// too. The blocks become visible to read once durable. A failed write or
// sync fails every later one: the journal must be opened again.
func (j *journal) write(buf []byte, blocks []pendingBlock) error {
	j.mu.Lock()
	if j.err != nil {
		j.mu.Unlock()
		return j.err
	}
	seg := j.segs[len(j.segs)-1]
	if seg.size > 0 && seg.size+int64(len(buf)) > j.segmentSize {
		if err := j.rollLocked(seg); err != nil {
			j.mu.Unlock()
			return err
		}
		seg = j.segs[len(j.segs)-1]
	}
	off := seg.size
	if _, err := seg.f.Write(buf); err != nil {
		j.err = fmt.Errorf("log segment %s: write: %w", seg.name, err)
		j.mu.Unlock()
		return j.err
	}
	seg.size += int64(len(buf))
	j.written += uint64(len(buf))
	end := j.written
	for _, b := range blocks {
		seg.groups[b.group] = b.last
	}
	j.mu.Unlock()

	if err := j.sync(end); err != nil {
		return err
	}

	j.mu.Lock()
	defer j.mu.Unlock()
	for _, b := range blocks {
		gl := j.groups[b.group]
		if gl == nil {
			gl = &groupLog{}
			j.groups[b.group] = gl
		}
		gl.last = b.last
		gl.blocks = append(gl.blocks, blockRef{seg: seg, off: off + int64(b.off), len: b.len, last: b.last})
	}
	return nil
}

// rollLocked syncs the segment written and starts the next one.
func (j *journal) rollLocked(seg *segment) error {
	if err := seg.f.SyncData(); err != nil {
		j.err = fmt.Errorf("log segment %s: sync: %w", seg.name, err)
		return j.err
	}
	casMax(&j.synced, j.written)
	seg.durable = seg.size
	if err := j.create(seg.seq + 1); err != nil {
		j.err = err
		return err
	}
	return nil
}

// sync returns once the first end bytes written are durable. Callers that
// arrive during a sync wait for it and share the next one.
func (j *journal) sync(end uint64) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced.Load() >= end {
		return nil
	}
	j.mu.Lock()
	if j.err != nil {
		j.mu.Unlock()
		return j.err
	}
	seg, written := j.segs[len(j.segs)-1], j.written
	size := seg.size
	seg.refs++
	j.mu.Unlock()
	err := seg.f.SyncData()
	j.mu.Lock()
	defer j.mu.Unlock()
	j.releaseLocked(seg)
	if err != nil {
		if j.err == nil {
			j.err = fmt.Errorf("log segment %s: sync: %w", seg.name, err)
		}
		return j.err
	}
	casMax(&j.synced, written)
	seg.durable = max(seg.durable, size)
	return nil
}

func casMax(v *atomic.Uint64, n uint64) {
	for {
		old := v.Load()
		if old >= n || v.CompareAndSwap(old, n) {
			return
		}
	}
}

// releaseLocked drops a reference to seg, closing a deleted one's file
// with the last.
func (j *journal) releaseLocked(seg *segment) {
	if seg.refs--; seg.refs == 0 && seg.deleted {
		_ = seg.f.Close()
	}
}

// read calls fn with the group's records above after, in position order,
// from the blocks durable when it began. fn's error ends it and is
// returned as is; a failed read is wrapped.
func (j *journal) read(group uint32, after persistence.Position, check func() error, fn func(persistence.Position, []byte) error) (fnErr, err error) {
	j.mu.Lock()
	var blocks []blockRef
	if gl := j.groups[group]; gl != nil {
		after = max(after, gl.trimmed) // deleted, as far as callers know
		i, _ := slices.BinarySearchFunc(gl.blocks, after+1, func(b blockRef, p persistence.Position) int {
			return cmp.Compare(b.last, p)
		})
		blocks = slices.Clone(gl.blocks[i:])
	}
	for _, b := range blocks {
		b.seg.refs++
	}
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		for _, b := range blocks {
			j.releaseLocked(b.seg)
		}
	}()
	var buf []byte
	for _, b := range blocks {
		if err := check(); err != nil {
			return nil, err
		}
		buf = slices.Grow(buf[:0], int(b.len))[:b.len]
		if _, err := b.seg.f.ReadAt(buf, b.off); err != nil {
			return nil, fmt.Errorf("log segment %s: read at %d: %w", b.seg.name, b.off, err)
		}
		h, records, err := decodeBlock(buf)
		if err == nil && h.group != group {
			err = fmt.Errorf("block of group %d", h.group)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: segment %s offset %d: %w", errCorruptLog, b.seg.name, b.off, err)
		}
		for p := h.first; len(records) > 0; p++ {
			l, k := binary.Uvarint(records)
			data := records[k : k+int(l)]
			records = records[k+int(l):]
			if p <= after {
				continue
			}
			if err := fn(p, data); err != nil {
				return err, nil
			}
		}
	}
	return nil, nil
}

// trim records that the group has checkpointed through a position: its
// blocks at or below it are forgotten, and the segments every record of
// which is checkpointed are deleted.
func (j *journal) trim(group uint32, through persistence.Position) {
	j.mu.Lock()
	gl := j.groups[group]
	if gl == nil {
		gl = &groupLog{}
		j.groups[group] = gl
	}
	j.trimLocked(gl, through)
	j.mu.Unlock()
	j.deleteCovered()
}

func (j *journal) trimLocked(gl *groupLog, through persistence.Position) {
	if through > gl.trimmed {
		gl.trimmed = through
		gl.dropTrimmed()
	}
}

// dropTrimmed forgets the blocks at or below the group's checkpoint.
func (gl *groupLog) dropTrimmed() {
	through := gl.trimmed
	i := 0
	for i < len(gl.blocks) && gl.blocks[i].last <= through {
		i++
	}
	gl.blocks = slices.Delete(gl.blocks, 0, i)
}

// deleteCovered deletes the segments, but the one written, whose every
// record is at or below its group's checkpoint.
func (j *journal) deleteCovered() {
	j.mu.Lock()
	var gone []*segment
	j.segs = slices.DeleteFunc(j.segs, func(seg *segment) bool {
		if seg == j.segs[len(j.segs)-1] {
			return false
		}
		for id, last := range seg.groups {
			if gl := j.groups[id]; gl == nil || last > gl.trimmed {
				return false
			}
		}
		gone = append(gone, seg)
		return true
	})
	for _, seg := range gone {
		seg.deleted = true
		if seg.refs == 0 {
			_ = seg.f.Close()
		}
	}
	j.mu.Unlock()
	for _, seg := range gone {
		// A failed removal leaves a segment that the next Open deletes.
		_ = j.fs.Remove(seg.name)
	}
}

// close closes the segments' files. Calls in progress must be over.
func (j *journal) close() {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, seg := range j.segs {
		if !seg.deleted {
			seg.deleted = true
			_ = seg.f.Close()
		}
	}
	j.segs = nil
}

// frameBuilder encodes one frame: add the records of each group in
// position order (a block ends when the group changes or a position is
// skipped), then finish.
type frameBuilder struct {
	buf    []byte
	blocks []pendingBlock
	count  uint32 // records in the open block
}

// add appends a record of group at position pos.
func (f *frameBuilder) add(group uint32, pos persistence.Position, data []byte) error {
	if f.count > 0 {
		if b := &f.blocks[len(f.blocks)-1]; b.group != group || b.last+1 != pos {
			if err := f.endBlock(); err != nil {
				return err
			}
		}
	}
	if len(f.buf) == 0 {
		var h [frameHeaderLen]byte
		f.buf = append(f.buf, h[:]...)
	}
	if f.count == 0 {
		f.blocks = append(f.blocks, pendingBlock{group: group, off: len(f.buf)})
		f.buf = startBlock(f.buf, group, pos)
	}
	f.buf = appendRecord(f.buf, data)
	f.count++
	f.blocks[len(f.blocks)-1].last = pos
	return nil
}

func (f *frameBuilder) endBlock() error {
	if f.count == 0 {
		return nil
	}
	b := &f.blocks[len(f.blocks)-1]
	if err := endBlock(f.buf[b.off:], f.count); err != nil {
		return fmt.Errorf("group %d: %w", b.group, err)
	}
	b.len, f.count = uint32(len(f.buf)-b.off), 0
	return nil
}

// finish completes the frame (if it holds any record).
func (f *frameBuilder) finish() error {
	if err := f.endBlock(); err != nil || len(f.blocks) == 0 {
		return err
	}
	if len(f.buf) > maxFrameLen {
		return fmt.Errorf("%d bytes in one append: more than %d", len(f.buf), maxFrameLen)
	}
	binary.LittleEndian.PutUint32(f.buf[4:], uint32(len(f.buf)))
	binary.LittleEndian.PutUint32(f.buf[8:], uint32(len(f.blocks)))
	crc := crc32.Update(0, crcTable, f.buf[4:frameHeaderLen])
	for _, b := range f.blocks {
		crc = crc32.Update(crc, crcTable, f.buf[b.off:b.off+4])
	}
	binary.LittleEndian.PutUint32(f.buf, crc)
	return nil
}

// reset empties f for the next frame, keeping its buffers.
func (f *frameBuilder) reset() {
	f.buf, f.blocks, f.count = f.buf[:0], f.blocks[:0], 0
}

// appendRecord appends one record (its length, then data) to a block.
func appendRecord(dst, data []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(data)))
	return append(dst, data...)
}

// startBlock appends a block header to dst, to be completed by endBlock
// once its records follow it.
func startBlock(dst []byte, group uint32, first persistence.Position) []byte {
	var h [blockHeaderLen]byte
	binary.LittleEndian.PutUint32(h[8:], group)
	binary.LittleEndian.PutUint64(h[12:], first)
	return append(dst, h[:]...)
}

// endBlock completes the block that starts at b[0] and fills b.
func endBlock(b []byte, count uint32) error {
	if len(b) > maxBlockLen {
		return fmt.Errorf("%d bytes of records of one group in one append: more than %d", len(b), maxBlockLen)
	}
	binary.LittleEndian.PutUint32(b[4:], uint32(len(b)))
	binary.LittleEndian.PutUint32(b[20:], count)
	binary.LittleEndian.PutUint32(b, crc32.Checksum(b[4:], crcTable))
	return nil
}
