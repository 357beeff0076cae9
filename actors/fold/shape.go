package fold

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// A pipeline's shape is what its packed states (AppendPacked) need to be
// read by name rather than by position: its aggregates' names and ops, in
// the order the packed form holds them. A store that keeps packed
// snapshots (actors/packed.go) keeps each shape they were written with
// beside them and the shape's id in each, so a later configuration of the
// pipeline (aggregates added, removed, renamed or of another op) restores
// them as it restores a KeyState: by name and op.
//
//	shape  n, then per aggregate: len name, len op
//
// (lengths and n are uvarints). Its id is the xxhash64 of those bytes.

// Shape returns the pipeline's shape and its id; nil and 0 if AppendPacked
// does not write its states positionally (only a pipeline with aggregates
// only does: no windows, patterns, handler, join or sketches).
func (p *Pipeline) Shape() ([]byte, uint64) { return p.shape, p.shapeID }

// compileShape sets p.shape and p.shapeID from the compiled pipeline, if
// its states pack positionally.
func (p *Pipeline) compileShape() {
	if !p.packsCore() {
		return
	}
	b := binary.AppendUvarint(nil, uint64(len(p.aggs)))
	for _, a := range p.aggs {
		b = binary.AppendUvarint(b, uint64(len(a.name)))
		b = append(b, a.name...)
		op := a.op.String()
		b = binary.AppendUvarint(b, uint64(len(op)))
		b = append(b, op...)
	}
	p.shape, p.shapeID = b, xxhash.Sum64(b)
}

// ShapeID returns the id of an encoded shape.
func ShapeID(shape []byte) uint64 { return xxhash.Sum64(shape) }

// shapeAgg is one aggregate of a decoded shape.
type shapeAgg struct{ name, op string }

// parseShape decodes a shape; every aggregate takes two bytes at least, so
// a shape of n bytes names at most n/2 (bad bytes cost what they are).
func parseShape(shape []byte) ([]shapeAgg, error) {
	r := packedReader{b: shape}
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b))/2 {
		return nil, errors.New("fold: shape: too many aggregates")
	}
	aggs := make([]shapeAgg, 0, n)
	for range n {
		name := string(r.bytes(r.uvarint()))
		op := string(r.bytes(r.uvarint()))
		if o := opNames[op]; r.err == nil && !packsOp(o) {
			// Another op's state packs otherwise, or not at all: a
			// later build's shape, not to be read as this one's.
			return nil, fmt.Errorf("fold: shape: aggregate %q of op %q does not pack", name, op)
		}
		aggs = append(aggs, shapeAgg{name, op})
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return nil, fmt.Errorf("fold: shape: %w", r.err)
	}
	return aggs, nil
}

// UnpackShaped decodes a state AppendPacked encoded with a pipeline of the
// given shape (this pipeline as it was configured then, maybe): a state of
// this pipeline's own shape decodes as UnpackState does; any other's
// aggregates are matched by name and op, as RestoreParts matches stored
// ones (those this pipeline no longer has are dropped, new ones start
// empty), and its ids are kept by this pipeline's dedup window.
func (p *Pipeline) UnpackShaped(shape, data []byte) (State, error) {
	if own, id := p.Shape(); own != nil && id == ShapeID(shape) {
		return p.UnpackState(data)
	}
	aggs, err := parseShape(shape)
	if err != nil {
		return State{}, err
	}
	if len(data) == 0 || !positional(data[0]) {
		return State{}, errors.New("fold: packed state: not positional")
	}
	r := packedReader{b: data[1:]}
	ks := &keyfoldv1.KeyState{Seq: r.uvarint(), Duplicates: r.uvarint(), NowMs: r.varint()}
	for _, a := range aggs {
		as := &keyfoldv1.AggregateState{Name: a.name, Op: a.op}
		if as.Count = r.uvarint(); as.Count == 0 {
			continue
		}
		as.Number = r.number()
		as.LastJson = slices.Clone(r.bytes(r.uvarint())) // (data is the store's)
		ks.Aggregates = append(ks.Aggregates, as)
	}
	n := r.uvarint()
	if n > uint64(len(r.b)) { // each id takes two bytes at least
		return State{}, errors.New("fold: packed state: too many ids")
	}
	prev := ks.NowMs
	for range n {
		id, fp, at := r.idOf(data[0], prev, ks.NowMs)
		ks.Seen = append(ks.Seen, &keyfoldv1.SeenID{Id: string(id), Fingerprint: fp, AtMs: at})
		prev = at
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return State{}, fmt.Errorf("fold: packed state: %w", r.err)
	}
	return p.RestoreParts(ks, func(b int64, _ int) ([]byte, error) {
		return nil, fmt.Errorf("fold: packed state names id bucket %d", b)
	})
}
