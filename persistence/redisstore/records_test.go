package redisstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/s2"
)

// loginRecords returns n log-record-like byte strings: JSON login events,
// which compress to about half.
func loginRecords(n int) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	var recs [][]byte
	for i := range n {
		var b []byte
		for range 1 + rng.IntN(8) {
			b = append(b, `{"user_id":"u`...)
			b = append(b, byte('0'+rng.IntN(10)), byte('0'+rng.IntN(10)))
			b = append(b, `","event_id":"run-`...)
			b = append(b, byte('0'+i%10))
			b = append(b, `","type":"login_ok","amount":42,"geo":{"country":"DE"}}`...)
		}
		recs = append(recs, b)
	}
	return recs
}

// TestRecordEncoder: one encoder's values stay intact while it encodes
// more (also across a new buffer), each decodes to its record, a record
// that does not shrink is stored as is, and so is one above
// maxCompressedRecord.
func TestRecordEncoder(t *testing.T) {
	var e recordEncoder
	recs := loginRecords(400) // more than the first 64 KiB buffer holds
	rng := rand.New(rand.NewPCG(3, 4))
	random := make([]byte, 300)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	recs = append(recs, random, []byte("x"), nil)
	fields := make([]string, len(recs))
	values := make([][]byte, len(recs))
	for i, r := range recs {
		fields[i], values[i] = e.encode(r)
	}
	compressed := 0
	for i, r := range recs {
		d, err := decodeRecord(map[string]any{fields[i]: string(values[i])})
		if err != nil || !bytes.Equal(d, r) {
			t.Fatalf("record %d (%s): %q, %v; want %q", i, fields[i], d, err, r)
		}
		if i < 400 && len(r) >= 200 && fields[i] != fieldCompressed {
			t.Errorf("login record %d of %d bytes (two events or more) stored as is", i, len(r))
		}
		if fields[i] == fieldCompressed {
			compressed++
			if len(values[i]) >= len(r) {
				t.Errorf("record %d compressed to %d bytes from %d", i, len(values[i]), len(r))
			}
		} else if !bytes.Equal(values[i], r) {
			t.Errorf("record %d stored as is, but as %q", i, values[i])
		}
	}
	if compressed == 0 {
		t.Error("no record compressed")
	}
	for i, r := range [][]byte{random, []byte("x")} {
		if f, _ := e.encode(r); f != fieldRecord {
			t.Errorf("incompressible record %d stored in field %s", i, f)
		}
	}
	big := bytes.Repeat([]byte("a"), maxCompressedRecord+1)
	if f, v := e.encode(big); f != fieldRecord || len(v) != len(big) {
		t.Errorf("a record above maxCompressedRecord stored in field %s, %d bytes", f, len(v))
	}
}

// TestDecodeRecordRefuses: an entry without a record, a damaged block and
// one that says it is larger than any this store compresses fail with an
// error, the last before allocating.
func TestDecodeRecordRefuses(t *testing.T) {
	if _, err := decodeRecord(map[string]any{"x": "y"}); err == nil {
		t.Error("an entry without a record decoded")
	}
	z := s2.Encode(nil, bytes.Repeat([]byte("login "), 100))
	if _, err := decodeRecord(map[string]any{fieldCompressed: string(z[:len(z)-3])}); err == nil {
		t.Error("a truncated block decoded")
	}
	// A block whose header says 1 GiB: a uvarint length, then a literal.
	huge := append(binary.AppendUvarint(nil, 1<<30), 0, 'a')
	if _, err := decompressRecord(huge); !errors.Is(err, errRecordTooLarge) {
		t.Errorf("a block saying 1 GiB: %v, want errRecordTooLarge", err)
	}
}

// FuzzDecompressRecord: any bytes in a compressed entry either decode to
// at most maxCompressedRecord bytes or fail; never a panic. A record
// encoded decodes to itself.
func FuzzDecompressRecord(f *testing.F) {
	for _, r := range loginRecords(8) {
		f.Add(r)
		f.Add(s2.Encode(nil, r))
	}
	f.Add([]byte{})
	f.Add(append(binary.AppendUvarint(nil, 1<<30), 0, 'a'))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := decompressRecord(b); err == nil && len(d) > maxCompressedRecord {
			t.Fatalf("decoded %d bytes", len(d))
		}
		var e recordEncoder
		field, v := e.encode(b)
		d, err := decodeRecord(map[string]any{field: string(v)})
		if err != nil || !bytes.Equal(d, b) {
			t.Fatalf("round trip through field %s: %q, %v", field, d, err)
		}
	})
}
