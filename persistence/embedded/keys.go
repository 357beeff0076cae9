package embedded

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/keyfold/keyfold/persistence"
)

// The key layout. Every key starts with one byte naming its kind; integers
// are big-endian, so that byte order is numeric order and a group's records
// are contiguous and sorted by position.
//
//	'm' name               meta: "format" → uint64 formatVersion,
//	                                 "groups" → uint32 number of key groups
//	'e' group:4            the group's epoch (uint64); absent = 0, unclaimed
//	'c' group:4            the group's checkpoint position (uint64); absent = 0
//	'l' group:4 pos:8      format 1 only: a log record, whose value is its
//	                       data (format 2 keeps the log in segment files,
//	                       journal.go; Open moves a format 1 log there)
//	's' group:4 key        a key's snapshot; the value is its data
//	't' group:4 key        a key's entry in the group's timer index; the value
//	                       is its due time (int64 Unix ms)
//	'o' len:4 name seq:8   an output record of the pipeline name (len bytes);
//	                       the value is its append time (int64 Unix ms) and
//	                       then its data
//	'p' len:4 name         the sequence number of the last output record a
//	                       trim of pipeline name deleted (uint64)
//	'n' group:4            the ids of the group's last checkpoint with ids
//	                       while the id index (its own Pebble, ids.go) may
//	                       not hold them yet: appendPendingIDs's form
//	'd' group:4            the group's drops of its ids (idDrops's form)
//	'h' bucket:8 group:4   the group holds ids in the bucket of the id
//	                       index; the value is their latest Expires (int64
//	                       Unix ms; math.MaxInt64: never)
//	'i' group:4 bucket:8 len:4 key id
//	                       formats 4 to 6 only, read until dropped: an id in
//	                       the group's id index, under its time bucket; the
//	                       value is when its key applied it (int64 Unix
//	                       ms). A bucket's ids are contiguous, so that
//	                       dropping the buckets below one is one range
//	                       deletion; the key is length-prefixed, so that no
//	                       key's ids are a prefix of another's. Format 7
//	                       keeps the index in a Pebble of its own (ids.go).
//
// A group's last position is not stored: it is the larger of the position of
// its last log record and its checkpoint. A checkpoint never goes beyond the
// last position, so once it covers the whole log the checkpoint holds it,
// and positions are never reused, also after a reopen. Appends therefore
// write only their records.
//
// Output records of a pipeline get sequence numbers 1, 2, 3, … in append
// order (a cursor is the decimal number), and their append times never go
// down, so a trim deletes a prefix of the pipeline's records with one range
// deletion. As with log positions, the next sequence number is one above
// the larger of the last record's and the trim mark's: it is never reused.
// The pipeline's name is length-prefixed, so that no pipeline's keys are a
// prefix of another's.
//
// Values of the integer keys are 8 (uint64) or 4 (uint32) bytes big-endian.
const (
	kindMeta       = 'm'
	kindEpoch      = 'e'
	kindCheckpoint = 'c'
	kindLog        = 'l'
	kindSnapshot   = 's'
	kindTimer      = 't'
	kindOutput     = 'o'
	kindOutputTrim = 'p'
	kindID         = 'i'
	kindPendingIDs = 'n'
	kindIDDrops    = 'd'
	kindIDHeld     = 'h'
)

// formatVersion is the version of this key layout, recorded in a new store.
// The timer and output keys came later, without a new version: a store
// without them is one with no timers and no outputs. Version 2 moved the
// log out of Pebble (journal.go). Version 3 allows snapshots in keyfold's
// packed form (actors/packed.go); the key layout is version 2's. Version 4
// adds the id index ('i' keys) and snapshots that hold fingerprints of the
// ids it keeps (keyfold.v1.SeenID.fingerprint), which older keyfolds would
// read as no ids. Version 5 keeps remembered ids as a key's log does, in
// packed states (fold.PackedVersion 3) and in id bucket parts (their
// packed form, fold.SnapshotOptions.PackedParts), about half the bytes;
// a version 4 keyfold would fail to read them, so it refuses the store.
// Version 6 keeps the ids' times to the second where the dedup window
// allows it, in entries an older keyfold would fail to read (the packed
// form's version 4, a part's packed form's version 2); it reads what
// version 5 wrote. Version 7 keeps the id index in a Pebble of its own
// (ids.go), which an older keyfold would not look in; it reads the
// index an older version left in the store's Pebble until the drops
// emptied it.
const formatVersion = 7

var (
	metaFormatKey = []byte("mformat")
	metaGroupsKey = []byte("mgroups")
	// metaLayoutKey is the key-group layout, written with metaGroupsKey in
	// a new store (absent in stores created before it: layout 0).
	metaLayoutKey = []byte("mlayout")
)

// groupKey returns kind+group, with room for more bytes.
func groupKey(kind byte, group uint32, extra int) []byte {
	return appendGroupKey(make([]byte, 0, 5+extra), kind, group)
}

func epochKey(group uint32) []byte      { return groupKey(kindEpoch, group, 0) }
func checkpointKey(group uint32) []byte { return groupKey(kindCheckpoint, group, 0) }

// logKeyLen is the length of a log record's key.
const logKeyLen = 1 + 4 + 8

// appendLogKey appends the key of a group's record to dst.
func appendLogKey(dst []byte, group uint32, pos persistence.Position) []byte {
	dst = append(dst, kindLog)
	dst = binary.BigEndian.AppendUint32(dst, group)
	return binary.BigEndian.AppendUint64(dst, pos)
}

func logKey(group uint32, pos persistence.Position) []byte {
	return appendLogKey(make([]byte, 0, logKeyLen), group, pos)
}

// logPos decodes the position of a log record's key.
func logPos(key []byte) (persistence.Position, error) {
	if len(key) != logKeyLen || key[0] != kindLog {
		return 0, errors.New("malformed log key")
	}
	return binary.BigEndian.Uint64(key[5:]), nil
}

func snapshotKey(group uint32, key string) []byte {
	return appendSnapshotKey(make([]byte, 0, 5+len(key)), group, key)
}

// appendSnapshotKey appends the key of a key's snapshot to dst.
func appendSnapshotKey(dst []byte, group uint32, key string) []byte {
	return append(appendGroupKey(dst, kindSnapshot, group), key...)
}

// appendGroupKey appends kind+group to dst.
func appendGroupKey(dst []byte, kind byte, group uint32) []byte {
	return binary.BigEndian.AppendUint32(append(dst, kind), group)
}

// timerKey returns the key of a key's timer index entry.
func timerKey(group uint32, key string) []byte {
	return append(groupKey(kindTimer, group, len(key)), key...)
}

// timerBounds returns the key range [lower, upper) of a group's timer index.
func timerBounds(group uint32) (lower, upper []byte) { return groupBounds(kindTimer, group) }

// snapshotBounds returns the key range [lower, upper) of a group's
// snapshots; lower is the prefix of each.
func snapshotBounds(group uint32) (lower, upper []byte) { return groupBounds(kindSnapshot, group) }

// groupBounds returns the key range [lower, upper) of a group's keys of a
// kind.
func groupBounds(kind byte, group uint32) (lower, upper []byte) {
	lower = groupKey(kind, group, 0)
	if group == math.MaxUint32 {
		return lower, []byte{kind + 1}
	}
	return lower, groupKey(kind, group+1, 0)
}

// idKey returns the key of an id in a group's id index.
func idKey(group uint32, bucket int64, key, id string) []byte {
	return appendIDKey(make([]byte, 0, 5+8+4+len(key)+len(id)), group, bucket, key, id)
}

// appendIDKey appends the key of an id in a group's id index to dst.
func appendIDKey(dst []byte, group uint32, bucket int64, key, id string) []byte {
	k := binary.BigEndian.AppendUint64(appendGroupKey(dst, kindID, group), uint64(bucket))
	k = binary.BigEndian.AppendUint32(k, uint32(len(key)))
	k = append(k, key...)
	return append(k, id...)
}

// idBucketKey returns the first key of a bucket of a group's id index.
func idBucketKey(group uint32, bucket int64) []byte {
	return binary.BigEndian.AppendUint64(groupKey(kindID, group, 8), uint64(bucket))
}

// pipelineKey returns kind+len+name, with room for more bytes.
func pipelineKey(kind byte, pipeline string, extra int) []byte {
	k := make([]byte, 0, 5+len(pipeline)+extra)
	k = append(k, kind)
	k = binary.BigEndian.AppendUint32(k, uint32(len(pipeline)))
	return append(k, pipeline...)
}

// outputKey returns the key of a pipeline's output record.
func outputKey(pipeline string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(pipelineKey(kindOutput, pipeline, 8), seq)
}

// outputBounds returns the key range [lower, upper) of a pipeline's output
// records with sequence numbers from from up to and including through.
func outputBounds(pipeline string, from, through uint64) (lower, upper []byte) {
	lower = outputKey(pipeline, from)
	if through == math.MaxUint64 {
		// The first key after every one of the pipeline: its prefix + 1
		// (the prefix ends with the name, or its length if empty).
		upper = pipelineKey(kindOutput, pipeline, 0)
		for i := len(upper) - 1; i >= 0; i-- {
			if upper[i]++; upper[i] != 0 {
				return lower, upper[:i+1]
			}
		}
		return lower, []byte{kindOutput + 1} // unreachable: the kind byte does not wrap
	}
	return lower, outputKey(pipeline, through+1)
}

// outputSeq decodes the sequence number of an output record's key.
func outputSeq(key []byte) (uint64, error) {
	if len(key) < 1+4+8 || key[0] != kindOutput {
		return 0, errors.New("malformed output key")
	}
	return binary.BigEndian.Uint64(key[len(key)-8:]), nil
}

func outputTrimKey(pipeline string) []byte { return pipelineKey(kindOutputTrim, pipeline, 0) }

// outputValue returns the value of an output record: its time, then data.
func outputValue(ms int64, data []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(data)), uint64(ms)), data...)
}

// decodeOutput splits an output record's value.
func decodeOutput(v []byte) (ms int64, data []byte, err error) {
	if len(v) < 8 {
		return 0, nil, errors.New("malformed output record")
	}
	return int64(binary.BigEndian.Uint64(v)), v[8:], nil
}

func encodeUint64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func decodeUint64(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, errors.New("malformed uint64 value")
	}
	return binary.BigEndian.Uint64(b), nil
}

func encodeUint32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func decodeUint32(b []byte) (uint32, error) {
	if len(b) != 4 {
		return 0, errors.New("malformed uint32 value")
	}
	return binary.BigEndian.Uint32(b), nil
}
