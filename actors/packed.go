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
// aggregates by name). The state of a pipeline with aggregates only (one
// with a fold.Pipeline.Shape) whose remembered ids are inline (at most
// fold.InlineIDs, 32: fold.State.OnePart) is stored packed, in a store
// that allows it (persistence.PackedSnapshots), in a third of the bytes:
//
//	0x00 version  shape id (8 bytes, little-endian)  position (uvarint)  state
//
// where state is fold.Pipeline.AppendPacked's form (version
// fold.PackedVersion; older ones down to fold.MinPackedVersion are read
// too), the aggregates by
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
	if data[1] < fold.MinPackedVersion || data[1] > packedVersion {
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

// packedAt is the packed snapshot of the i-th key of a read.
type packedAt struct {
	i  int
	ps packedSnapshot
}

// loadPacked decodes the packed snapshots of keys keys[at.i] into
// out[at.i]: positionally those packed with their pipeline's shape, by
// name through the shape they were packed with the others (their
// pipelines' aggregates changed since), reading those shapes from the
// keys' groups (one read for the shapes not read before).
func loadPacked(ctx context.Context, store persistence.Store, pipelines map[string]*fold.Pipeline, keys []keyAt, packed []packedAt, out []loaded) error {
	type shapeRef struct {
		name string
		id   uint64
	}
	var (
		missing []shapeRef // shapes to read
		groups  []uint32   // the group each is read from (any holds it)
	)
	for _, at := range packed {
		id := keys[at.i].id
		if _, own := pipelines[id.pipeline].Shape(); own == at.ps.shape {
			continue
		}
		ref := shapeRef{shapeKey(id.pipeline, at.ps.shape), at.ps.shape}
		if _, ok := shapes.Load(ref.name); !ok && !slices.Contains(missing, ref) {
			missing = append(missing, ref)
			groups = append(groups, keys[at.i].group)
		}
	}
	if len(missing) > 0 {
		names := make([]string, len(missing))
		for j, ref := range missing {
			names[j] = ref.name
		}
		vals, err := readGroups(ctx, store, groups, names)
		if err != nil {
			return err
		}
		for j, ref := range missing {
			// One that does not hash to its id is not it (and is an
			// error below).
			if vals[j] != nil && fold.ShapeID(vals[j]) == ref.id {
				shapes.Store(ref.name, slices.Clone(vals[j]))
			}
		}
	}
	for _, at := range packed {
		id := keys[at.i].id
		p := pipelines[id.pipeline]
		var (
			state fold.State
			err   error
		)
		if _, own := p.Shape(); own == at.ps.shape {
			state, err = p.UnpackState(at.ps.state)
		} else if shape, ok := shapes.Load(shapeKey(id.pipeline, at.ps.shape)); ok {
			state, err = p.UnpackShaped(shape.([]byte), at.ps.state)
		} else {
			err = fmt.Errorf("packed with shape %016x, which its group does not hold", at.ps.shape)
		}
		if err != nil {
			return fmt.Errorf("snapshot of %s/%s: %w", id.pipeline, id.key, err)
		}
		out[at.i] = loaded{found: true, state: &state, pos: at.ps.pos}
	}
	return nil
}
