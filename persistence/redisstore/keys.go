package redisstore

import (
	"strconv"
	"strings"
)

// The key layout, for a prefix P (Options.Prefix, "keyfold" by default) and
// a key group N (decimal):
//
//	P:meta               hash   format (layout version), groups (number of key groups)
//	{P:N}:m              hash   epoch, checkpoint, last: the group's fencing token,
//	                            its checkpoint position and its last appended position
//	{P:N}:log            stream the group's log; the record at position n has the
//	                            ID n-0 and one field, d, holding the record
//	{P:N}:s:KEY          string the snapshot stored under KEY (opaque, binary)
//
// Every key of group N carries the hash tag {P:N}, so they all live in one
// Redis Cluster slot and one script updates them atomically; the prefix is
// part of the tag so that deployments sharing a Redis spread over different
// slots. Positions start at 1 and are never reused: last only grows, and a
// stream remembers its last ID after its entries are trimmed.
//
// A group's fields in {P:N}:m are absent until its first claim; a store
// without P:meta is new.
const formatVersion = 1

// keys builds the store's Redis keys.
type keys struct{ prefix string }

func (k keys) meta() string { return k.prefix + ":meta" }

// tag returns the hash tag of a group, with its braces.
func (k keys) tag(group uint32) string {
	return "{" + k.prefix + ":" + strconv.FormatUint(uint64(group), 10) + "}"
}

func (k keys) groupMeta(group uint32) string { return k.tag(group) + ":m" }
func (k keys) log(group uint32) string       { return k.tag(group) + ":log" }

func (k keys) snapshot(group uint32, key string) string {
	var b strings.Builder
	tag := k.tag(group)
	b.Grow(len(tag) + 3 + len(key))
	b.WriteString(tag)
	b.WriteString(":s:")
	b.WriteString(key)
	return b.String()
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
