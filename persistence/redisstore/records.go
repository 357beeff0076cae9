package redisstore

import (
	"errors"
	"fmt"

	"github.com/klauspost/compress/s2"
)

// A log record is a stream entry of one field: "d", the record as the
// host wrote it, or, in format 4, "s", an S2 block of it
// (github.com/klauspost/compress/s2) where that is smaller.
//
// Why: with appendonly and appendfsync always, every byte an append writes
// is read from the socket, kept in the stream, written to the append-only
// file and synced, and written again by the next AOF rewrite, which Redis
// starts each time the file doubles. The rewrites, not the appends, were
// most of what bounded keyfold on Redis (at 100k keys, 131k events/s
// with rewrites off against 76k with them on: BENCHMARKS.md, session 53).
// Login events of the bench compress to about half; S2 does it at ~1.5
// GB/s on this machine, a tenth of a microsecond an event, where zstd's
// fastest level took ten times as long for a few percent less.
const (
	fieldRecord     = "d"
	fieldCompressed = "s"

	// maxCompressedRecord is the largest record stored compressed: a
	// larger one is stored as is, and a compressed one that says it is
	// larger is refused, so that a damaged entry cannot make a read
	// allocate more than this.
	maxCompressedRecord = 64 << 20
)

// recordEncoder compresses the records of one Append into one buffer.
type recordEncoder struct{ buf []byte }

// encode returns the field and value that store data: the S2 block of data
// (in e's buffer, valid until the Append is sent) if smaller, else data.
func (e *recordEncoder) encode(data []byte) (field string, value []byte) {
	if len(data) > maxCompressedRecord {
		return fieldRecord, data
	}
	n := s2.MaxEncodedLen(len(data))
	if cap(e.buf)-len(e.buf) < n {
		// A new buffer: values handed out before keep the old one.
		e.buf = make([]byte, 0, max(n, 2*cap(e.buf), 64<<10))
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
