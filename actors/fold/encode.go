package fold

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Direct encoding of the snapshot parts of a key without windows or
// patterns: the messages keyfold.v1.KeyState and keyfold.v1.SeenBucket
// appended field by field, as proto.Marshal would write them (fields in
// number order, zero values omitted), without building the messages first.
// Every event of a first-time key, and nearly every event over millions of
// keys, is followed by a snapshot of its key; building the messages was a
// quarter of the bytes a node allocated per event (BENCHMARKS.md). The
// encoded bytes decode with proto.Unmarshal like any other; TestDirectEncoding
// holds them equal to the messages'.

// Field numbers of keyfold.v1.KeyState, AggregateState, SeenBucket and
// SeenID (proto/keyfold/v1/log.proto).
const (
	ksSeq, ksNow, ksAggregates, ksSeen, ksSeenBuckets, ksDuplicates, ksWatermark, ksLate = 1, 2, 3, 4, 5, 6, 7, 8
	ksSeenBucketParts, ksSeenPartIDs                                                     = 15, 16
	asName, asCount, asNumber, asLast, asOp, asSketch                                    = 1, 2, 3, 4, 5, 6
	sbIDs                                                                                = 1
	siID, siAt, siFingerprint                                                            = 1, 2, 3
)

// appendCore appends the state's KeyState, its ids inline or, once they
// spilled, as the list of their buckets. The pipeline has no windows or
// patterns.
func (p *Pipeline) appendCore(b []byte, s *State, fpBefore int) ([]byte, error) {
	b = appendVarintField(b, ksSeq, s.seq)
	b = appendVarintField(b, ksNow, uint64(s.now))
	a := &s.aggs
	for i := range p.aggs {
		count := a.count(i)
		if count == 0 {
			continue
		}
		sk, err := encodeSketch(a, i)
		if err != nil {
			return nil, fmt.Errorf("fold: encode aggregate %q: %w", p.aggs[i].name, err)
		}
		b = protowire.AppendTag(b, ksAggregates, protowire.BytesType)
		var mark int
		b, mark = beginMessage(b)
		b = appendStringField(b, asName, p.aggs[i].name)
		b = appendVarintField(b, asCount, count)
		if bits := math.Float64bits(a.numOf(p.ops[i], i)); bits != 0 {
			b = protowire.AppendTag(b, asNumber, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, bits)
		}
		b = appendBytesField(b, asLast, a.lastOf(p.ops[i], i))
		b = appendStringField(b, asOp, p.aggs[i].op.String())
		b = appendBytesField(b, asSketch, sk)
		b = endMessage(b, mark)
	}
	if !s.ids.spilled {
		for c := s.ids.cursor(); c.more(); {
			b = appendSeenID(b, ksSeen, &c, fpBefore)
		}
	} else if len(s.ids.buckets) > 0 { // packed
		b = protowire.AppendTag(b, ksSeenBuckets, protowire.BytesType)
		var mark int
		b, mark = beginMessage(b)
		for _, bi := range s.ids.buckets {
			b = protowire.AppendVarint(b, uint64(bi.bucket))
		}
		b = endMessage(b, mark)
	}
	b = appendVarintField(b, ksDuplicates, s.dups)
	b = appendVarintField(b, ksWatermark, uint64(s.Watermark()))
	b = appendVarintField(b, ksLate, s.Late())
	if s.ids.spilled && s.ids.multipart() {
		b = protowire.AppendTag(b, ksSeenBucketParts, protowire.BytesType)
		var mark int
		b, mark = beginMessage(b)
		for _, bi := range s.ids.buckets {
			b = protowire.AppendVarint(b, uint64(partsOf(bi.added)))
		}
		b = endMessage(b, mark)
	}
	if s.ids.spilled && len(s.ids.buckets) > 0 {
		b = appendVarintField(b, ksSeenPartIDs, partIDs)
	}
	return b, nil
}

// appendSeenID appends the cursor's next id as field num: of a SeenBucket
// (sbIDs), or of a KeyState holding its ids inline (ksSeen).
func appendSeenID(b []byte, num protowire.Number, c *idCursor, fpBefore int) []byte {
	id, fp, at := c.nextAs(fpBefore)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b, mark := beginMessage(b)
	b = appendBytesField(b, siID, id)
	b = appendVarintField(b, siAt, uint64(at))
	if fp != 0 {
		b = protowire.AppendTag(b, siFingerprint, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, fp)
	}
	return endMessage(b, mark)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
}

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// beginMessage reserves one byte for the length of a message that follows;
// endMessage writes the length, moving the message if it needs more bytes.
// (Most messages here are shorter than 128 bytes.)
func beginMessage(b []byte) ([]byte, int) { return append(b, 0), len(b) + 1 }

func endMessage(b []byte, start int) []byte {
	n := len(b) - start
	if n < 0x80 {
		b[start-1] = byte(n)
		return b
	}
	size := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, size-1)...)
	copy(b[start-1+size:], b[start:start+n])
	protowire.AppendVarint(b[:start-1], uint64(n))
	return b
}
