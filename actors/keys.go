package actors

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// keyID names one key's actor.
type keyID struct {
	pipeline string
	key      string
}

// snapshotKey is the key's name in the snapshot store. Pipeline names and
// keys contain no NUL, so names never collide.
func (id keyID) snapshotKey() string { return id.pipeline + "\x00" + id.key }

// bucketKey names one of the key's id buckets in the snapshot store.
func (id keyID) bucketKey(bucket int64) string {
	return id.snapshotKey() + "\x00b" + strconv.FormatInt(bucket, 10)
}

// GroupOf returns the key group of a (pipeline, key) among groups groups. It
// is a well-mixed 64-bit hash (xxHash64) of both, so keys spread evenly
// whatever their shape.
func GroupOf(pipeline, key string, groups uint32) uint32 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(pipeline)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(key)
	return uint32(d.Sum64() % uint64(groups))
}
