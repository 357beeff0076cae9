package redisstore

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The key layout, for a prefix P (Options.Prefix, "keyfold" by default) and
// a key group N (decimal):
//
//	P:meta               hash   format (layout version: below), groups (number of key groups)
//	{P:N}:m              hash   epoch, checkpoint, last: the group's fencing token,
//	                            its checkpoint position and its last appended position
//	{P:N}:log            stream the group's log; the record at position n has the
//	                            ID n-0 and one field, d, holding the record
//	{P:N}:s:KEY          string the snapshot stored under KEY (opaque, binary)
//	{P:N}:due            zset   the group's timer index: member KEY, score the
//	                            Unix ms its next timer is due
//	P:out:PIPELINE       stream the output log of PIPELINE (opaque); entries
//	                            have automatic IDs ms-seq (the cursors) and one
//	                            field, d, holding the output
//
// Every key of group N carries the hash tag {P:N}, so they all live in one
// Redis Cluster slot and one script updates them atomically; the prefix is
// part of the tag so that deployments sharing a Redis spread over different
// slots. Positions start at 1 and are never reused: last only grows, and a
// stream remembers its last ID after its entries are trimmed. An output log
// belongs to no group: each command on it touches that key only, and
// checkpoints append to it with XADD before their script (see
// Store.Checkpoint).
//
// A group's fields in {P:N}:m are absent until its first claim; a store
// without P:meta is new.
//
// The format (layout version) a new store records is 2: the layout of 1,
// and snapshots that may be in keyfold's packed form (actors/packed.go),
// which keyfolds that know only version 1 cannot read: they refuse the
// store. A store that recorded 1 keeps it, and keyfold writes its
// snapshots in the other form (persistence.PackedSnapshots), so that nodes
// of an older build may still run on it.
const (
	formatVersion    = 2
	oldFormatVersion = 1 // still served, without packed snapshots
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
func (k keys) due(group uint32) string       { return k.tag(group) + ":due" }
func (k keys) output(pipeline string) string { return k.prefix + ":out:" + pipeline }

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
