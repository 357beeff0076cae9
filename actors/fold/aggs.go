package fold

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/DataDog/sketches-go/ddsketch"
	"github.com/axiomhq/hyperloglog"
)

// aggSet is the state of the aggregates of a key, or of one of its
// windows: parallel to them (Pipeline.ops, window.ops), one allocation
// without pointers whatever their number.
//
// b holds aggSlot bytes an aggregate: its count, then its number or, of
// last, where its value is in b (offset and length, 0 while it has none);
// after them, the last values. A key in memory is meant to take less
// than a KiB, and at a million keys what an event costs most beyond ten
// thousand keys is the collector's walk over the keys' objects, a cache
// miss for every pointer it follows into one (BENCHMARKS.md, session 57):
// as a slice of structs with the last value and the sketches behind
// pointers, the aggregates were two objects a key (240 B of pointers to
// scan and a value of a few bytes), not one of less than 100 B to mark.
// Setting a last value copies it, so no state keeps an event's bytes.
//
// The zero aggSet is empty: every aggregate at count 0 (its b is
// allocated as the first one takes a value). sk holds the sketches of
// distinct and quantiles aggregates, nil until one has a value.
type aggSet struct {
	b  []byte
	sk *[]sketches
}

// aggSlot is the bytes of one aggregate in aggSet.b.
const aggSlot = 16

// sketches hold the sketch of a distinct or quantiles aggregate.
type sketches struct {
	hll *hyperloglog.Sketch // distinct
	dd  *ddsketch.DDSketch  // quantiles
}

// makeAggSet returns an empty set of n aggregates, allocated with room
// for last values of extra bytes.
func makeAggSet(n, extra int) aggSet { return aggSet{b: classBytes(n*aggSlot, n*aggSlot+extra)} }

// classBytes returns n zero bytes with room for c at least: up to the
// size class of c (an append from nil rounds it), not doubled as append
// to a full slice would (a key's values rarely grow).
func classBytes(n, c int) []byte { return append([]byte(nil), make([]byte, c)...)[:n] }

// count returns aggregate i's count (0 for an empty set).
func (a *aggSet) count(i int) uint64 {
	if a.b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(a.b[i*aggSlot:])
}

func (a *aggSet) setCount(i int, n uint64) { binary.LittleEndian.PutUint64(a.b[i*aggSlot:], n) }

// num returns aggregate i's number (sum, min, max).
func (a *aggSet) num(i int) float64 {
	if a.b == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(a.b[i*aggSlot+8:]))
}

// numOf is aggregate i's number as stored: 0 of last, whose slot holds
// where its value is.
func (a *aggSet) numOf(op Op, i int) float64 {
	if op == OpLast {
		return 0
	}
	return a.num(i)
}

func (a *aggSet) setNum(i int, f float64) {
	binary.LittleEndian.PutUint64(a.b[i*aggSlot+8:], math.Float64bits(f))
}

// lastRef returns where last aggregate i's value is in b.
func (a *aggSet) lastRef(i int) (off, n int) {
	if a.b == nil {
		return 0, 0
	}
	return int(binary.LittleEndian.Uint32(a.b[i*aggSlot+8:])), int(binary.LittleEndian.Uint32(a.b[i*aggSlot+12:]))
}

func (a *aggSet) setLastRef(i, off, n int) {
	binary.LittleEndian.PutUint32(a.b[i*aggSlot+8:], uint32(off))
	binary.LittleEndian.PutUint32(a.b[i*aggSlot+12:], uint32(n))
}

// last returns last aggregate i's value (JSON), nil if it has none. It is
// the set's own bytes, which it changes in place: valid until the set
// changes, so what leaves the key's actor (a query's answer, a message)
// takes a copy.
func (a *aggSet) last(i int) []byte {
	off, n := a.lastRef(i)
	if n == 0 {
		return nil
	}
	return a.b[off : off+n : off+n]
}

// lastOf is aggregate i's last value if it is of last (nil otherwise).
func (a *aggSet) lastOf(op Op, i int) []byte {
	if op != OpLast {
		return nil
	}
	return a.last(i)
}

// setLast sets last aggregate i's value to a copy of v; ops are the
// set's aggregates' (the other last values may move within b).
func (a *aggSet) setLast(ops []Op, i int, v []byte) {
	off, n := a.lastRef(i)
	if len(v) == n && n > 0 { // the same length (a country, a status): in place
		copy(a.b[off:off+n], v)
		return
	}
	if n > 0 { // take the old value out, the values after it moving down
		if end := off + n; end < len(a.b) {
			copy(a.b[off:], a.b[end:])
			for j, op := range ops {
				if o, m := a.lastRef(j); op == OpLast && j != i && m > 0 && o > off {
					a.setLastRef(j, o-n, m)
				}
			}
		}
		a.b = a.b[:len(a.b)-n]
		a.setLastRef(i, 0, 0)
	}
	if len(v) == 0 {
		return
	}
	if need := len(a.b) + len(v); need > cap(a.b) {
		b := classBytes(len(a.b), need)
		copy(b, a.b)
		a.b = b
	}
	a.setLastRef(i, len(a.b), len(v))
	a.b = append(a.b, v...)
}

// sketchesAt returns aggregate i's sketches, nil if it has none.
func (a *aggSet) sketchesAt(i int) *sketches {
	if a.sk == nil {
		return nil
	}
	return &(*a.sk)[i]
}

// hllSketch and ddSketch return aggregate i's sketch, nil if none.
func (a *aggSet) hllSketch(i int) *hyperloglog.Sketch {
	if sk := a.sketchesAt(i); sk != nil {
		return sk.hll
	}
	return nil
}

func (a *aggSet) ddSketch(i int) *ddsketch.DDSketch {
	if sk := a.sketchesAt(i); sk != nil {
		return sk.dd
	}
	return nil
}

// sketch returns aggregate i's sketches of a set of n, creating them if
// needed.
func (a *aggSet) sketch(n, i int) *sketches {
	if a.sk == nil {
		sk := make([]sketches, n)
		a.sk = &sk
	}
	return &(*a.sk)[i]
}

// allocate gives an empty set of ops its bytes, with room for short last
// values (a country, a status) so that the first does not allocate again.
func (a *aggSet) allocate(ops []Op) {
	room := 0
	for _, op := range ops {
		if op == OpLast {
			room += 8
		}
	}
	a.b = makeAggSet(len(ops), room).b
}

// add folds one contribution into aggregate i.
func (a *aggSet) add(ops []Op, i int, c *contribution) {
	if !c.ok {
		return
	}
	if a.b == nil {
		a.allocate(ops)
	}
	count := a.count(i)
	switch op := ops[i]; op {
	case OpSum:
		a.setNum(i, a.num(i)+c.num)
	case OpMin:
		if count == 0 || c.num < a.num(i) {
			a.setNum(i, c.num)
		}
	case OpMax:
		if count == 0 || c.num > a.num(i) {
			a.setNum(i, c.num)
		}
	case OpLast:
		a.setLast(ops, i, c.val)
	case OpDistinct:
		if sk := a.sketch(len(ops), i); sk.hll == nil {
			sk.hll = hyperloglog.New14()
		}
		a.hllSketch(i).Insert(c.val)
	case OpQuantiles:
		if sk := a.sketch(len(ops), i); sk.dd == nil {
			sk.dd = newDDSketch()
		}
		if a.ddSketch(i).Add(c.num) != nil {
			return // outside the sketch's range (beyond ±1e300): not counted
		}
	}
	a.setCount(i, count+1)
}

// merge folds aggregate i of b into a's (sessions merging); for last, b's
// value wins if newer.
func (a *aggSet) merge(ops []Op, i int, b *aggSet, newer bool) {
	bc := b.count(i)
	if bc == 0 {
		return
	}
	if a.b == nil {
		a.allocate(ops)
	}
	count := a.count(i)
	switch ops[i] {
	case OpSum:
		a.setNum(i, a.num(i)+b.num(i))
	case OpMin:
		if count == 0 || b.num(i) < a.num(i) {
			a.setNum(i, b.num(i))
		}
	case OpMax:
		if count == 0 || b.num(i) > a.num(i) {
			a.setNum(i, b.num(i))
		}
	case OpLast:
		if newer || count == 0 {
			a.setLast(ops, i, b.last(i))
		}
	case OpDistinct:
		if b.hllSketch(i) == nil {
			break // nothing to merge
		}
		if sk := a.sketch(len(ops), i); sk.hll == nil {
			sk.hll = hyperloglog.New14()
		}
		_ = a.hllSketch(i).Merge(b.hllSketch(i)) // same precision: cannot fail
	case OpQuantiles:
		if b.ddSketch(i) == nil {
			break // nothing to merge
		}
		if sk := a.sketch(len(ops), i); sk.dd == nil {
			sk.dd = newDDSketch()
		}
		_ = a.ddSketch(i).MergeWith(b.ddSketch(i)) // same mapping: cannot fail
	}
	a.setCount(i, count+bc)
}

// restore sets aggregate i, of a set allocated for ops, to a stored
// count, number and last value (the sketch is restored apart).
func (a *aggSet) restore(ops []Op, i int, count uint64, num float64, last []byte) {
	a.setCount(i, count)
	if ops[i] == OpLast {
		a.setLast(ops, i, last)
		return
	}
	a.setNum(i, num)
}

// memSize estimates the bytes the set holds.
func (a *aggSet) memSize() int {
	n := cap(a.b)
	if a.sk == nil {
		return n
	}
	n += cap(*a.sk)*int(unsafe.Sizeof(sketches{})) + 24
	for _, sk := range *a.sk {
		if sk.hll != nil {
			n += hllBytes
		}
		if sk.dd != nil {
			n += ddBytes
		}
	}
	return n
}
