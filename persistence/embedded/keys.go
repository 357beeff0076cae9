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
//	'l' group:4 pos:8      a log record; the value is the record's data
//	's' group:4 key        a key's snapshot; the value is its data
//
// A group's last position is not stored: it is the larger of the position of
// its last log record and its checkpoint. A checkpoint never goes beyond the
// last position, so after one that trims of the whole log the checkpoint holds it, and
// positions are never reused, also after a reopen. Appends therefore write
// only their records.
//
// Values of the integer keys are 8 (uint64) or 4 (uint32) bytes big-endian.
const (
	kindMeta       = 'm'
	kindEpoch      = 'e'
	kindCheckpoint = 'c'
	kindLog        = 'l'
	kindSnapshot   = 's'
)

// formatVersion is the version of this key layout, recorded in a new store.
const formatVersion = 1

var (
	metaFormatKey = []byte("mformat")
	metaGroupsKey = []byte("mgroups")
)

// groupKey returns kind+group, with room for more bytes.
func groupKey(kind byte, group uint32, extra int) []byte {
	k := make([]byte, 5, 5+extra)
	k[0] = kind
	binary.BigEndian.PutUint32(k[1:], group)
	return k
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

// logBounds returns the key range [lower, upper) of a group's records at
// positions from from up to and including through.
func logBounds(group uint32, from, through persistence.Position) (lower, upper []byte) {
	lower = logKey(group, from)
	if through == math.MaxUint64 {
		return lower, logEnd(group)
	}
	return lower, logKey(group, through+1)
}

// logEnd returns the first key after all of a group's records.
func logEnd(group uint32) []byte {
	if group == math.MaxUint32 {
		return []byte{kindLog + 1}
	}
	return groupKey(kindLog, group+1, 0)
}

// logPos decodes the position of a log record's key.
func logPos(key []byte) (persistence.Position, error) {
	if len(key) != logKeyLen || key[0] != kindLog {
		return 0, errors.New("malformed log key")
	}
	return binary.BigEndian.Uint64(key[5:]), nil
}

func snapshotKey(group uint32, key string) []byte {
	return append(groupKey(kindSnapshot, group, len(key)), key...)
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
