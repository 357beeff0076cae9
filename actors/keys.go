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

// appendSnapshotKey appends snapshotKey to b, without a string.
func (id keyID) appendSnapshotKey(b []byte) []byte {
	return append(append(append(b, id.pipeline...), 0), id.key...)
}

// bucketKey names a part of one of the key's id buckets in the snapshot
// store (part 0 is named as buckets were before they had parts).
func (id keyID) bucketKey(bucket int64, part int) string {
	name := id.snapshotKey() + "\x00b" + strconv.FormatInt(bucket, 10)
	if part > 0 {
		name += "p" + strconv.Itoa(part)
	}
	return name
}

// Layout is how a store maps keys to key groups. The store records it when
// it is created (persistence.Store.CheckGroups), so every node on one store
// uses the same; see docs/decisions/2026-12-01-joins.md.
type Layout uint32

const (
	// LayoutPipelineKey hashes the pipeline and the key: the layout of
	// stores created before layouts were recorded (which read as 0). The
	// same key falls in different groups in different pipelines, so such a
	// store cannot serve joins.
	LayoutPipelineKey Layout = 1
	// LayoutKey hashes the key alone: every pipeline's actor of a key, and
	// every join's, is in one key group. New stores are laid out so.
	LayoutKey Layout = 2
)

// storedLayout reads the layout a store returned (0: created before
// layouts were recorded).
func storedLayout(v uint32) Layout {
	if v == 0 {
		return LayoutPipelineKey
	}
	return Layout(v)
}

func (l Layout) String() string {
	switch l {
	case LayoutPipelineKey:
		return "1 (key group of pipeline and key)"
	case LayoutKey:
		return "2 (key group of the key)"
	}
	return strconv.FormatUint(uint64(l), 10) + " (unknown)"
}

// GroupOf returns the key group of a pipeline's key among groups groups,
// in this layout.
func (l Layout) GroupOf(pipeline, key string, groups uint32) uint32 {
	if l == LayoutPipelineKey {
		var d xxhash.Digest
		d.Reset()
		_, _ = d.WriteString(pipeline)
		_, _ = d.Write([]byte{0})
		_, _ = d.WriteString(key)
		return uint32(d.Sum64() % uint64(groups))
	}
	return GroupOf(key, groups)
}

// GroupOf returns the key group of a key among groups groups in a store of
// LayoutKey (every store created since layouts are recorded): a well-mixed
// 64-bit hash (xxHash64) of the key, so keys spread evenly whatever their
// shape, and a key's actors of every pipeline and join share it.
func GroupOf(key string, groups uint32) uint32 {
	return uint32(xxhash.Sum64String(key) % uint64(groups))
}
