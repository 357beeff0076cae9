package actors

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
)

// A key's snapshot is stored in one of two forms. Any state can be stored
// as a keyfold.v1.Snapshot (its pipeline, key, position and KeyState, the
// aggregates by name). The state of a pipeline with aggregates only
// (fold.Pipeline.PacksState) whose remembered ids are inline (at most 8:
// fold.State.OnePart) is stored packed, in a store that allows it
// (persistence.PackedSnapshots), in a third of the bytes:
//
//	0x00 version  shape id (8 bytes, little-endian)  position (uvarint)  state
//
// where state is fold.Pipeline.AppendPacked's form (version
// fold.PackedVersion, 1), the aggregates by
// position, and the shape id names the pipeline's aggregates (names and
// ops) in that order: fold.Pipeline.Shape. Each checkpoint that writes
// packed snapshots of a pipeline writes its shape beside them, under
// shapeKey, so a state packed by an older configuration of the pipeline is
// read by name as a Snapshot's is. At a million keys nearly every event is
// followed by a snapshot, and encoding, flushing and compacting them was a
// quarter of the node's CPU; packed, a key takes 58 B instead of 172 with
// examples/bench.yaml's aggregates and one id (BENCHMARKS.md, session 31).
//
// A Snapshot never starts with 0x00 (no protobuf field has number 0): a
// keyfold that does not know the packed form fails to decode one rather
// than reading it as an empty state, and a store that allows packed
// snapshots refuses to be opened by such a keyfold (its format version).
const (
	packedMarker  = 0x00
	packedVersion = fold.PackedVersion
	// packedHeaderRoom is the most bytes the header before the state takes.
	packedHeaderRoom = 2 + 8 + binary.MaxVarintLen64
)

// appendPackedHeader appends the header of a packed snapshot.
func appendPackedHeader(b []byte, shape uint64, pos uint64) []byte {
	b = append(b, packedMarker, packedVersion)
	b = binary.LittleEndian.AppendUint64(b, shape)
	return binary.AppendUvarint(b, pos)
}

// isPacked reports whether a stored snapshot is in the packed form.
func isPacked(data []byte) bool { return len(data) > 0 && data[0] == packedMarker }

// packedSnapshot is a stored packed snapshot, decoded as far as its header.
type packedSnapshot struct {
	shape uint64
	pos   uint64
	state []byte // fold.Pipeline.AppendPacked's form
}

var errPackedHeader = errors.New("packed snapshot: bad header")

// parsePacked decodes the header of a packed snapshot.
func parsePacked(data []byte) (packedSnapshot, error) {
	if len(data) < 2+8 || data[0] != packedMarker {
		return packedSnapshot{}, errPackedHeader
	}
	if data[1] != packedVersion {
		return packedSnapshot{}, errors.New("packed snapshot: unknown version " + strconv.Itoa(int(data[1])))
	}
	shape := binary.LittleEndian.Uint64(data[2:])
	pos, n := binary.Uvarint(data[10:])
	if n <= 0 || 10+n >= len(data) {
		return packedSnapshot{}, errPackedHeader
	}
	return packedSnapshot{shape: shape, pos: pos, state: data[10+n:]}, nil
}

// shapeKey is the name of a pipeline's shape in its key groups' snapshots:
// a group's record (a leading NUL, isKeySnapshot).
func shapeKey(pipeline string, id uint64) string {
	return "\x00shape/" + pipeline + "/" + strconv.FormatUint(id, 16)
}

// shapes keeps the shapes read from the store, by shapeKey: a shape is
// fixed by its id (the hash of its bytes), whatever group held it.
var shapes sync.Map // string → []byte

// loadForeign decodes the packed snapshots datas[i], i in which, of keys
// ids[i] of group g, whose pipelines' shapes changed since they were
// written, into out[i]: by name, through the shapes they were packed with,
// read from the group (one read for those not read before).
func loadForeign(ctx context.Context, store persistence.Store, pipelines map[string]*fold.Pipeline, g uint32, ids []keyID, datas [][]byte, which []int, out []loaded) error {
	if len(which) == 0 {
		return nil
	}
	type want struct {
		name string
		id   uint64
	}
	var missing []want
	for _, i := range which {
		ps, _ := parsePacked(datas[i]) // (parsed by the caller)
		w := want{shapeKey(ids[i].pipeline, ps.shape), ps.shape}
		if _, ok := shapes.Load(w.name); !ok && !slices.Contains(missing, w) {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		names := make([]string, len(missing))
		for j, w := range missing {
			names[j] = w.name
		}
		vals, err := store.GetMany(ctx, g, names)
		if err != nil {
			return err
		}
		for j, w := range missing {
			// One that does not hash to its id is not it (and is an
			// error below).
			if j < len(vals) && vals[j] != nil && fold.ShapeID(vals[j]) == w.id {
				shapes.Store(w.name, slices.Clone(vals[j]))
			}
		}
	}
	for _, i := range which {
		ps, _ := parsePacked(datas[i])
		id := ids[i]
		shape, ok := shapes.Load(shapeKey(id.pipeline, ps.shape))
		if !ok {
			return fmt.Errorf("snapshot of %s/%s: packed with shape %016x, which its group does not hold", id.pipeline, id.key, ps.shape)
		}
		state, err := pipelines[id.pipeline].UnpackShaped(shape.([]byte), ps.state)
		if err != nil {
			return fmt.Errorf("snapshot of %s/%s: %w", id.pipeline, id.key, err)
		}
		out[i] = loaded{found: true, state: &state, pos: ps.pos}
	}
	return nil
}
