package redisstore

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
)

// A log record is a stream entry of one field: "d", the record as the
// host wrote it, or, in format 4, "s", an S2 block of it
// (github.com/klauspost/compress/s2) where that is smaller.
//
// Why: with appendonly and appendfsync always, every byte an append writes
// is read from the socket, kept in the stream, written to the append-only
// file and synced; and Redis rewrites the file (a forked child writes out
// the whole dataset) each time it doubles, so the more bytes appended, the
// more often. The rewrites, not the appends, were most of what bounded
// keyfold on Redis (at 100k keys, 131k events/s with rewrites off against
// 76k with them on: BENCHMARKS.md, session 53). Login events of the bench
// compress to about half; S2 does it at ~1.5 GB/s on this machine, a
// tenth of a microsecond an event, where zstd's fastest level took 13
// times as long for 17% fewer bytes.
const (
	fieldRecord     = "d"
	fieldCompressed = "s"

	// maxCompressedRecord is the largest record stored compressed: a
	// larger one is stored as is, and a compressed one that says it is
	// larger is refused, so that a damaged entry cannot make a read
	// allocate more than this.
	maxCompressedRecord = 64 << 20
)

// recordEncoder compresses the records of one Append into one buffer,
// sized for them at once (reserve) and handed to the next Append once
// this one's commands are sent and answered (release).
type recordEncoder struct{ buf []byte }

// encodeBufs holds the buffers of Appends that released theirs.
var encodeBufs sync.Pool // of *[]byte

// maxPooledEncodeBuf bounds the buffers kept for the next Append (a
// commit's records at 100k keys compress into ~150 KiB).
const maxPooledEncodeBuf = 8 << 20

// encodedLen is the room encode may take for a record of n bytes.
func encodedLen(n int) int {
	if n > maxCompressedRecord {
		return 0
	}
	return s2.MaxEncodedLen(n)
}

// reserve gives e a buffer of at least n bytes: a released one if large
// enough.
func (e *recordEncoder) reserve(n int) {
	if p, ok := encodeBufs.Get().(*[]byte); ok && cap(*p) >= n {
		e.buf = (*p)[:0]
		return
	}
	e.buf = make([]byte, 0, n)
}

// release hands e's buffer to the next Append; the values encode returned
// must no longer be read.
func (e *recordEncoder) release() {
	if b := e.buf[:0]; cap(b) > 0 && cap(b) <= maxPooledEncodeBuf {
		encodeBufs.Put(&b)
	}
	e.buf = nil
}

// encode returns the field and value that store data: the S2 block of data
// (in e's buffer, until release) if smaller, else data.
func (e *recordEncoder) encode(data []byte) (field string, value []byte) {
	n := encodedLen(len(data))
	if n == 0 {
		return fieldRecord, data // (over maxCompressedRecord)
	}
	if cap(e.buf)-len(e.buf) < n {
		// (Not reserved for: a new buffer, the values handed out before
		// keep the old one.)
		e.buf = make([]byte, 0, max(n, 2*cap(e.buf)))
	}
	start := len(e.buf)
	z := s2.Encode(e.buf[start:start+n], data)
	if len(z) >= len(data) {
		return fieldRecord, data
	}
	e.buf = e.buf[:start+len(z)]
	return fieldCompressed, z[:len(z):len(z)]
}

var errRecordTooLarge = errors.New("compressed record says it is larger than any this store compresses")

// decodeRecord returns the record a log entry's values hold.
func decodeRecord(values map[string]any) ([]byte, error) {
	if d, ok := values[fieldRecord].(string); ok {
		return []byte(d), nil
	}
	z, ok := values[fieldCompressed].(string)
	if !ok {
		return nil, errors.New("no record")
	}
	return decompressRecord([]byte(z))
}

// decompressRecord decodes an S2 block of a record, refusing one that
// says it is larger than maxCompressedRecord before allocating.
func decompressRecord(z []byte) ([]byte, error) {
	n, err := s2.DecodedLen(z)
	if err != nil {
		return nil, fmt.Errorf("compressed record: %w", err)
	}
	if n > maxCompressedRecord {
		return nil, fmt.Errorf("compressed record of %d bytes: %w", n, errRecordTooLarge)
	}
	d, err := s2.Decode(make([]byte, n), z)
	if err != nil {
		return nil, fmt.Errorf("compressed record: %w", err)
	}
	return d, nil
}
