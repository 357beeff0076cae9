package fold

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/bits"
	"unicode/utf8"
)

// Prepared events travel: a cluster member that validated a batch sends
// each other owner its share with what Prepare read of each event (its
// id, time, the pattern filters it matched, each aggregate's contribution)
// next to the event itself, so that the owner applies it as read instead
// of parsing and validating it again. AppendPrepared encodes that part;
// Forwarded decodes it, checking that it is well formed and within bounds,
// never that it agrees with the event (the owner trusts a member for that:
// see Fingerprint).
//
// The encoding of one event, after a uvarint of its length (0: nothing was
// sent, the owner prepares the event itself):
//
//	uvarint len(id), id           ("" when the event has no id)
//	byte    flags                 (1: timed, 2: steps follow)
//	uvarint time                  (if timed)
//	uvarint steps                 (if flagged)
//	per aggregate, in the pipeline's order:
//	  byte 0                      (no contribution), or 1 and then
//	  8 bytes float64, little endian  (sum, min, max, quantiles)
//	  uvarint len, bytes           (last: the JSON value; distinct: the text)
//	  nothing                      (count)

const (
	preparedTimed = 1 << iota
	preparedSteps
)

// maxPreparedTime is the largest event time Prepare accepts.
const maxPreparedTime = 1 << 53

// Fingerprint identifies what Prepare reads of an event and how, for
// pipelines compiled by the same version of keyfold: two members whose
// pipelines of a name have different fingerprints were configured
// differently, and an owner prepares a sender's events itself. 0 is no
// fingerprint (never equal to a sender's).
func (p *Pipeline) Fingerprint() uint64 { return p.fingerprint }

// fingerprintOf hashes a pipeline's name and spec (as JSON: maps sorted).
func fingerprintOf(name string, spec Spec) uint64 {
	b, err := json.Marshal(spec)
	if err != nil {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(b)
	if s := h.Sum64(); s != 0 {
		return s
	}
	return 1
}

// AppendPrepared appends to b what Prepare read of ev (an event it
// prepared), length first. An event whose encoding would be larger than
// the event itself (many aggregates of one large field) is sent without it:
// a forwarded share stays within twice its events' bytes, and the owner
// prepares that one.
func (p *Pipeline) AppendPrepared(b []byte, ev *Event) []byte {
	start := len(b)
	b = append(b, 0) // the length, for most events one byte: moved below if not
	b = binary.AppendUvarint(b, uint64(len(ev.ID)))
	b = append(b, ev.ID...)
	var flags byte
	if ev.timed {
		flags |= preparedTimed
	}
	if ev.steps != 0 {
		flags |= preparedSteps
	}
	b = append(b, flags)
	if ev.timed {
		b = binary.AppendUvarint(b, uint64(ev.Time))
	}
	if ev.steps != 0 {
		b = binary.AppendUvarint(b, ev.steps)
	}
	for i := range p.aggs {
		c := &ev.contrib[i]
		if !c.ok {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		switch op := p.aggs[i].op; {
		case op.numeric():
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(c.num))
		case op == OpLast, op == OpDistinct:
			b = binary.AppendUvarint(b, uint64(len(c.val)))
			b = append(b, c.val...)
		}
	}
	n := len(b) - start - 1
	switch {
	case n > len(ev.Raw):
		return append(b[:start], 0)
	case n < 0x80:
		b[start] = byte(n)
		return b
	}
	// A longer length: shift the encoding to make room for it.
	var l [binary.MaxVarintLen64]byte
	ll := binary.PutUvarint(l[:], uint64(n))
	b = append(b, l[:ll-1]...)
	copy(b[start+ll:], b[start+1:start+1+n])
	copy(b[start:], l[:ll])
	return b
}

// errPrepared reports a prepared encoding that is not well formed: the
// sender's is not this version's, or the message was damaged.
var errPrepared = errors.New("malformed prepared fields")

// Forwarded rebuilds the events of a forwarded share: raws are the events
// as received (logged as they are), keys their keys, prepared their
// AppendPrepared encodings one after another, from a member whose pipeline
// has this one's Fingerprint. An event sent without its encoding is
// prepared here, and rejects the share as PrepareBatch would. Every key is
// checked (CheckKey), and every decoded value is one Prepare could have
// produced (an id of valid UTF-8, a time within range, only this
// pipeline's filters, finite numbers, JSON for last); what the events
// allocate is bounded by the bytes of the share. The events and their
// contributions are allocated together, as by PrepareBatch.
func (p *Pipeline) Forwarded(raws [][]byte, keys []string, prepared []byte) ([]*Event, error) {
	if len(keys) != len(raws) {
		return nil, fmt.Errorf("%w: %d keys for %d events", ErrInvalidEvent, len(keys), len(raws))
	}
	n := len(p.aggs)
	slab := make([]Event, len(raws))
	contribs := make([]contribution, len(raws)*n)
	events := make([]*Event, len(raws))
	for i, raw := range raws {
		l, w := binary.Uvarint(prepared)
		if w <= 0 || l > uint64(len(prepared)-w) {
			return nil, &BatchError{Index: i, Err: fmt.Errorf("%w: %w", ErrInvalidEvent, errPrepared)}
		}
		enc := prepared[w : w+int(l)]
		prepared = prepared[w+int(l):]
		ev, contrib := &slab[i], contribs[i*n:(i+1)*n:(i+1)*n]
		var err error
		switch {
		case len(enc) == 0: // sent without it
			if err = p.prepare(ev, raw, contrib); err == nil && ev.Key != keys[i] {
				err = &FieldError{Field: p.keyField, Reason: fmt.Sprintf("key %q, forwarded as %q", ev.Key, keys[i])}
			}
		default:
			err = p.decodePrepared(ev, raw, keys[i], enc, contrib)
		}
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		events[i] = ev
	}
	if len(prepared) > 0 {
		return nil, fmt.Errorf("%w: %w: %d bytes left over", ErrInvalidEvent, errPrepared, len(prepared))
	}
	return events, nil
}

// decodePrepared fills ev from one event's encoding.
func (p *Pipeline) decodePrepared(ev *Event, raw []byte, key string, enc []byte, contrib []contribution) error {
	if err := CheckKey(key); err != nil {
		return &FieldError{Field: p.keyField, Reason: err.(*FieldError).Reason}
	}
	*ev = Event{Raw: raw, Key: key, contrib: contrib}
	d := decoder{b: enc}
	if id := d.bytes(); len(id) > 0 {
		if !utf8.Valid(id) {
			return &FieldError{Field: p.idField, Reason: "id must be valid UTF-8"}
		}
		ev.ID = string(id)
	}
	flags := d.byte()
	if flags&^(preparedTimed|preparedSteps) != 0 {
		d.fail()
	}
	if flags&preparedTimed != 0 {
		t := d.uvarint()
		if t > maxPreparedTime {
			return &FieldError{Field: p.timeField, Reason: fmt.Sprintf("time in Unix milliseconds out of range: %d", t)}
		}
		ev.Time, ev.timed = int64(t), true
	}
	if flags&preparedSteps != 0 {
		ev.steps = d.uvarint()
		if bits.Len64(ev.steps) > len(p.steps) {
			d.fail() // a filter this pipeline does not have
		}
	}
	for i := range p.aggs {
		c := &contrib[i]
		*c = contribution{}
		if d.byte() == 0 {
			continue
		}
		c.ok = true
		switch op := p.aggs[i].op; {
		case op.numeric():
			c.num = math.Float64frombits(d.uint64())
			if math.IsNaN(c.num) || math.IsInf(c.num, 0) {
				return &FieldError{Field: p.aggs[i].field, Reason: "not a finite number"}
			}
		case op == OpLast:
			v := d.bytes()
			if !json.Valid(v) {
				return &FieldError{Field: p.aggs[i].field, Reason: "last value is not JSON"}
			}
			c.val = append([]byte(nil), v...) // the event may outlive the message
		case op == OpDistinct:
			c.val = append([]byte(nil), d.bytes()...)
		}
	}
	if d.err || len(d.b) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, errPrepared)
	}
	return nil
}

// decoder reads an encoding; a read past its end sets err and reads zeros.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) fail() { d.err, d.b = true, nil }

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, w := binary.Uvarint(d.b)
	if w <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[w:]
	return v
}

func (d *decoder) uint64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) bytes() []byte {
	l := d.uvarint()
	if l > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	v := d.b[:l]
	d.b = d.b[l:]
	return v
}
