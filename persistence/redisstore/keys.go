package redisstore

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/keyfold/keyfold/persistence"
)

// The key layout, for a prefix P (Options.Prefix, "keyfold" by default) and
// a key group N (decimal), in a store of format 4 (below):
//
//	P:meta               hash   format (layout version: below), groups (number of key groups),
//	                            keylayout (how keys map to groups)
//	{P:N}:m              hash   epoch, checkpoint: the group's fencing token and its
//	                            checkpoint position
//	{P:N}:log:E          stream the group's log, named after the group's epoch E; the
//	                            record at position n has the ID n-0 and one field: d,
//	                            holding the record, or s, holding an S2 block of it
//	                            where that is smaller (records.go)
//	{P:N}:s:KEY          string the snapshot stored under KEY (opaque, binary)
//	{P:N}:due            zset   the group's timer index: member KEY, score the
//	                            Unix ms its next timer is due
//	{P:N}:ids:B          hash   bucket B (decimal) of the group's id index: field
//	                            len:4 KEY ID (the key's length big-endian), value
//	                            the Unix ms the key applied the id; it expires
//	                            (EXPIREAT) at the latest expiry of its ids
//	{P:N}:idb            zset   the buckets the group's id index holds (member
//	                            and score B), so that a checkpoint can drop those
//	                            below one
//	P:out:PIPELINE       stream the output log of PIPELINE (opaque); entries
//	                            have automatic IDs ms-seq (the cursors) and one
//	                            field, d, holding the output
//
// Every key of group N carries the hash tag {P:N}, so they all live in one
// Redis Cluster slot and one script or transaction updates them atomically; the prefix is
// part of the tag so that deployments sharing a Redis spread over different
// slots. Positions start at 1 and are never reused: a stream remembers its
// last ID after its entries are trimmed, and a group's last position is its
// log's last ID. An output log belongs to no group: each command on it
// touches that key only, and checkpoints append to it with XADD before
// their atomic step (see Store.Checkpoint).
//
// A claim bumps the group's epoch and renames its log to the new epoch's
// name in one script (a new group gets an empty log), so an append is an
// XADD NOMKSTREAM of the group's record, with the ID of the position after
// the last one the owner knows, to the log of the owner's epoch:
//   - after a claim of another owner that log is gone and the append adds
//     nothing (fenced);
//   - a call sent twice, or after one whose outcome was unknown and which
//     landed, meets a log whose last ID is not below the record's: XADD
//     refuses it;
//   - no append reads or writes the group's meta, which formats 1 and 2 do
//     on every append (an HMGET of epoch and last and an HSET of last: as
//     much of Redis's CPU as the XADD at 256 groups per commit).
//
// Since appends leave the meta be, a checkpoint WATCHes it, checks the
// epoch and its position, and writes in a MULTI/EXEC that Redis drops if
// a claim came in between: no script, whose copies of the snapshots cost
// Redis about as much as writing them.
//
// Format 3 does not notice a log that lost its last records under its owner
// (Redis lost acknowledged writes: a failover to a replica that lagged, a
// host crash with appendfsync everysec), which format 2's check of last
// turned into a failed append and a new claim: the owner's next record
// takes its position after the gap. The lost records are lost either way;
// replay does not need positions without gaps, and the owner, which still
// has the lost records' events in memory, writes their effect with its
// next checkpoint unless it stops first.
//
// While the group's Redis Cluster slot migrates, a claim (which names the
// log it creates, a key that does not exist yet) gets TRYAGAIN, and a
// checkpoint fails too once keys of the group have moved (its WATCH and
// transaction follow no redirection; go-redis's cluster Watch may even
// return without running it, which checkpointWatched reports as an
// error), as a format 2 checkpoint fails with TRYAGAIN when its keys are
// split; the node retries both, with its backoff, until the slot has
// moved.
//
// A group's fields in {P:N}:m are absent until its first claim; a store
// whose P:meta has no groups is new (a group operation before CheckGroups
// records the format alone).
//
// Formats: a new store records 4. Format 3 (a store created between epoch
// logs and compressed records) keeps its layout, the one above but for
// the log's field s: its records are all stored as they are (field d), so
// that nodes of an older build may still run on it (what this package's
// comments say of format 3 holds for 4 too). Format 2 (a store
// created between packed snapshots and format 3) and format 1 (before
// packed snapshots) keep theirs, which is format 3's but for the log,
// named {P:N}:log whatever the epoch, and the group meta's third field,
// last (the last appended position), which every append checks and sets.
// Formats 2 to 4 allow snapshots in keyfold's packed form
// (actors/packed.go); on format 1 keyfold writes the other form
// (persistence.PackedSnapshots), likewise. A keyfold that does not know a
// store's format refuses it.
const (
	formatVersion = 4
	// minPackedFormat is the first format that allows packed snapshots.
	minPackedFormat = 2
	// minEpochLogFormat is the first format whose logs are named after
	// their epoch.
	minEpochLogFormat = 3
	// minCompressedLogFormat is the first format whose log records may be
	// compressed (records.go).
	minCompressedLogFormat = 4
)

// keys builds the store's Redis keys.
type keys struct{ prefix string }

func (k keys) meta() string { return k.prefix + ":meta" }

// tag returns the hash tag of a group, with its braces.
func (k keys) tag(group uint32) string {
	return "{" + k.prefix + ":" + strconv.FormatUint(uint64(group), 10) + "}"
}

func (k keys) groupMeta(group uint32) string { return k.tag(group) + ":m" }
func (k keys) log(group uint32) string       { return k.tag(group) + ":log" }

// epochLog is the name of a group's log under an epoch, in format 3.
func (k keys) epochLog(group uint32, epoch persistence.Epoch) string {
	return k.log(group) + ":" + strconv.FormatUint(epoch, 10)
}
func (k keys) due(group uint32) string       { return k.tag(group) + ":due" }
func (k keys) output(pipeline string) string { return k.prefix + ":out:" + pipeline }

// idBucket is the hash of a bucket of a group's id index, idBuckets the
// zset of its buckets.
func (k keys) idBucket(group uint32, bucket int64) string {
	return k.tag(group) + ":ids:" + strconv.FormatInt(bucket, 10)
}
func (k keys) idBuckets(group uint32) string { return k.tag(group) + ":idb" }

// idField is an id's field in its bucket's hash.
func idField(key, id string) string {
	var b strings.Builder
	b.Grow(4 + len(key) + len(id))
	b.Write(binary.BigEndian.AppendUint32(nil, uint32(len(key))))
	b.WriteString(key)
	b.WriteString(id)
	return b.String()
}

func (k keys) snapshot(group uint32, key string) string {
	var b strings.Builder
	tag := k.tag(group)
	b.Grow(len(tag) + 3 + len(key))
	b.WriteString(tag)
	b.WriteString(":s:")
	b.WriteString(key)
	return b.String()
}

// validCursor reports whether c is a stream entry ID, ms-seq, both parts
// decimal numbers below 2^64, and whether it is the largest one.
func validCursor(c string) (ok, largest bool) {
	ms, seq, ok := strings.Cut(c, "-")
	if !ok || !isDigits(ms) || !isDigits(seq) {
		return false, false
	}
	m, err1 := strconv.ParseUint(ms, 10, 64)
	n, err2 := strconv.ParseUint(seq, 10, 64)
	if err1 != nil || err2 != nil {
		return false, false
	}
	return true, m == math.MaxUint64 && n == math.MaxUint64
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// streamIDTime returns the time an automatic stream entry ID holds.
func streamIDTime(id string) (time.Time, error) {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("output entry ID %q is not a stream ID", id)
	}
	return time.UnixMilli(v), nil
}

// streamID is the stream entry ID of a log position.
func streamID(pos uint64) string { return strconv.FormatUint(pos, 10) + "-0" }

// parseStreamID returns the position a stream entry ID stands for.
func parseStreamID(id string) (uint64, error) {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok || seq != "0" {
		return 0, errBadID(id)
	}
	pos, err := strconv.ParseUint(ms, 10, 64)
	if err != nil || pos == 0 {
		return 0, errBadID(id)
	}
	return pos, nil
}
