package fold

import (
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
)

// Direct decoding of a stored id part (a keyfold.v1.SeenBucket), the
// counterpart of appendSeenID: read field by field from its wire form
// into the state's ids, as proto.Unmarshal and loadIDs would, without a
// message per id. A key whose ids are in buckets reads every part of them
// each time it comes back into memory; as messages (one allocation per
// id, and the id's string) their decoding was half of restoring such a key
// (BENCHMARKS.md, session 36). It accepts and refuses what proto.Unmarshal
// does (FuzzLoadPart holds them equal): unknown fields and fields of an
// unexpected wire type are skipped, a repeated scalar's last value counts,
// and an id that is not UTF-8 (a proto3 string) is an error.

var errPartUTF8 = errors.New("fold: id bucket part: an id is not valid UTF-8")

// loadPart adds the ids of a stored part of bucket b to s (those not
// expired nor already there, as loadIDs does, advancing newest likewise)
// and returns how many the part holds, and whether one of them is not in
// bucket b.
func (p *Pipeline) loadPart(s *State, data []byte, b int64, newest *newestRun) (n int, misplaced bool, err error) {
	w := p.bucketWidth()
	if len(data) > 0 && data[0] == packedPartMarker {
		return p.loadPackedPart(s, data, b, newest)
	}
	for len(data) > 0 {
		num, typ, tn := consumeTag(data)
		if tn < 0 {
			return 0, false, protowire.ParseError(tn)
		}
		data = data[tn:]
		if num != sbIDs || typ != protowire.BytesType {
			vn := protowire.ConsumeFieldValue(num, typ, data)
			if vn < 0 {
				return 0, false, protowire.ParseError(vn)
			}
			data = data[vn:]
			continue
		}
		msg, mn := protowire.ConsumeBytes(data)
		if mn < 0 {
			return 0, false, protowire.ParseError(mn)
		}
		data = data[mn:]
		id, fp, at, err := decodeSeenID(msg)
		if err != nil {
			return 0, false, err
		}
		n++
		misplaced = p.restorePartID(s, id, fp, at, b, w, newest) || misplaced
	}
	return n, misplaced, nil
}

// restorePartID restores one id of a stored part of bucket b (of width
// w) and reports whether the id is misplaced, not in bucket b.
func (p *Pipeline) restorePartID(s *State, id []byte, fp uint32, at, b, w int64, newest *newestRun) bool {
	// (The string is only looked up and copied: nothing keeps it.)
	p.restoreSeen(s, unsafe.String(unsafe.SliceData(id), len(id)), fp, at, newest)
	return at/w != b
}

// A stored part's packed form (SnapshotOptions.PackedParts): its ids as
// the key's log keeps them (appendIDEntry), the first one's time from 0,
// after a marker no SeenBucket starts with (a field number of 0 is no
// protobuf field's: a keyfold that does not know the form fails to decode
// it rather than reading it as a part without ids) and the form's
// version. 5 B an id the store's index holds, where a SeenID took 14
// (BENCHMARKS.md, sessions 46 and 47). Version 1, read and no longer
// written, has the entries of the packed form's version 3 (packedReader.entry).
//
//	0x00 0x02 entry...
const (
	packedPartMarker  = 0x00
	packedPartVersion = 2
)

// appendPackedPart appends the packed part of the next n ids of cursor c
// to dst, those held in full before log offset fpBefore as fingerprints
// (appendIDEntries).
func appendPackedPart(dst []byte, c *idCursor, n int, fpBefore int) []byte {
	return appendIDEntries(append(dst, packedPartMarker, packedPartVersion), c, n, 0, fpBefore)
}

// loadPackedPart is loadPart of a part in its packed form.
func (p *Pipeline) loadPackedPart(s *State, data []byte, b int64, newest *newestRun) (n int, misplaced bool, err error) {
	if len(data) < 2 || data[1] < 1 || data[1] > packedPartVersion {
		return 0, false, errors.New("fold: id bucket part: unknown packed form")
	}
	v1 := data[1] == 1
	w := p.bucketWidth()
	r := packedReader{b: data[2:]}
	for prev := int64(0); len(r.b) > 0; n++ {
		id, fp, at := r.entry(prev, v1)
		if r.err != nil {
			return 0, false, fmt.Errorf("fold: id bucket part: %w", r.err)
		}
		prev = at
		misplaced = p.restorePartID(s, id, fp, at, b, w, newest) || misplaced
	}
	return n, misplaced, nil
}

// decodeSeenID decodes a keyfold.v1.SeenID's id, fingerprint and at_ms.
func decodeSeenID(b []byte) (id []byte, fp uint32, at int64, err error) {
	for len(b) > 0 {
		num, typ, tn := consumeTag(b)
		if tn < 0 {
			return nil, 0, 0, protowire.ParseError(tn)
		}
		b = b[tn:]
		switch {
		case num == siID && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, 0, 0, protowire.ParseError(n)
			}
			if !utf8.Valid(v) { // (each one, as proto.Unmarshal checks them)
				return nil, 0, 0, errPartUTF8
			}
			id, b = v, b[n:]
		case num == siAt && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, 0, 0, protowire.ParseError(n)
			}
			at, b = int64(v), b[n:]
		case num == siFingerprint && typ == protowire.Fixed32Type:
			v, n := protowire.ConsumeFixed32(b)
			if n < 0 {
				return nil, 0, 0, protowire.ParseError(n)
			}
			fp, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, 0, 0, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return id, fp, at, nil
}

// consumeTag is protowire.ConsumeTag refusing, as proto.Unmarshal does,
// field numbers beyond protowire.MaxValidNumber.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1 // (ParseError reports a generic parse error)
	}
	return num, typ, n
}
