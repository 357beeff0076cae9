package fold

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// FuzzLoadPart holds loadPart to proto.Unmarshal and loadIDs, the decoding
// it replaces: it refuses exactly the parts proto.Unmarshal refuses, and of
// the others it counts the same ids, finds the same misplaced, and leaves
// the same ids in the state.
func FuzzLoadPart(f *testing.F) {
	p, err := Compile("p", Spec{Key: "k", ID: "id", DedupWindow: time.Hour,
		Aggregates: map[string]AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		f.Fatal(err)
	}
	w := p.bucketWidth()
	entry := func(fields ...[]byte) []byte { // a SeenID in a SeenBucket
		var m []byte
		for _, x := range fields {
			m = append(m, x...)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, sbIDs, protowire.BytesType), m)
	}
	idf := func(id string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, siID, protowire.BytesType), id)
	}
	atf := func(at int64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, siAt, protowire.VarintType), uint64(at))
	}
	fpf := func(fp uint32) []byte {
		return protowire.AppendFixed32(protowire.AppendTag(nil, siFingerprint, protowire.Fixed32Type), fp)
	}
	now := 10 * time.Hour.Milliseconds()
	var good []byte
	for i, id := range []string{"a", "bb", "a", "ccc", ""} {
		good = append(good, entry(idf(id), atf(now-int64(i)*w/2))...)
	}
	for _, seed := range [][]byte{
		nil,
		good,
		append(slices.Clone(good), protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 3)...), // unknown field
		entry(idf("x"), idf("y"), atf(now), atf(now-1)),                                                             // repeated scalars: the last
		entry(atf(now)), // no id
		entry(idf("old"), atf(now-2*time.Hour.Milliseconds())),                                           // expired
		entry(idf("\xff"), atf(now)),                                                                     // not UTF-8
		entry(protowire.AppendVarint(protowire.AppendTag(nil, siID, protowire.VarintType), 5), atf(now)), // id of the wrong type
		protowire.AppendVarint(protowire.AppendTag(nil, sbIDs, protowire.VarintType), 1),                 // ids of the wrong type
		good[:len(good)-1], // truncated
		{0x0a, 0x80},       // a bad length
		{0x00},             // field 0
		entry(idf("n"), atf(-5)),
		entry(fpf(0x01020304), atf(now)), // a fingerprint
		append(entry(fpf(7), atf(now)), entry(fpf(7), atf(now))...),                                               // the same twice
		append(append(entry(fpf(7), atf(now-1)), entry(idf("e"), atf(now))...), entry(fpf(7), atf(now-1))...),     // again, older
		entry(idf("x"), fpf(9), atf(now)),                                                                         // an id and a fingerprint: the id
		entry(protowire.AppendVarint(protowire.AppendTag(nil, siFingerprint, protowire.VarintType), 5), atf(now)), // of the wrong type
		append(entry(idf("d"), atf(now)), entry(idf("d"), atf(now))...),                                           // the same id twice
		append(append(entry(idf("d"), atf(now-1)), entry(idf("e"), atf(now))...), entry(idf("d"), atf(now-1))...),
		// Found by the fuzzer: a field number beyond the largest; an id
		// not UTF-8, then a valid one (each occurrence is checked).
		[]byte("\x9d\x9d\x9d\x9d00000"),
		[]byte("\n22\x010000\x95000100000000002\x0100\x98\xc4\x870\n\n000000\xa4000\n\a0000000"),
	} {
		f.Add(seed, now, int64(now/w))
	}
	// The packed form: its ids as the log keeps them.
	packed := func(entries ...seenID) []byte {
		var log idSet
		for _, e := range entries {
			if fp, ok := strings.CutPrefix(e.id, "\x00fp"); ok {
				v, _ := strconv.ParseUint(fp, 16, 32)
				log.addFingerprint(uint32(v), e.at, w)
			} else {
				log.add(e.id, e.at, w)
			}
		}
		c := log.cursor()
		return appendPackedPart(nil, &c, len(entries), 0)
	}
	goodPacked := packed(seenID{"a", now - w}, seenID{fpName(0x01020304), now - w/2}, seenID{"bb", now})
	for _, seed := range [][]byte{
		goodPacked,
		goodPacked[:len(goodPacked)-1], // truncated
		packed(seenID{"old", now - 2*time.Hour.Milliseconds()}),                  // expired
		packed(seenID{fpName(7), now}, seenID{"e", now}, seenID{fpName(7), now}), // the same twice
		packed(seenID{"d", now - 1}, seenID{"e", now}, seenID{"d", now - 1}),     // older again
		packed(seenID{"n", -5}),
		{0x00, 0x03, 0x00, 0x01, 'x'},  // an unknown version
		{0x00, 0x02, 0x00, 0x00},       // an empty id
		{0x00, 0x02, 0x01, 0, 0, 0, 0}, // a fingerprint of 0
		{0x00, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, // a varint too long
		// Whole seconds beyond the bound of a time difference, and at it.
		binary.AppendUvarint([]byte{0x00, 0x02}, (maxIDDelta/1000+1)<<2|3),
		append(binary.AppendUvarint([]byte{0x00, 0x02}, (maxIDDelta/1000)<<2|3), 1, 2, 3, 4),
		// Version 1: entries whose times are in ms (the packed form's version 3's).
		{0x00, 0x01, 0x00, 0x00},
		{0x00, 0x01, 0x01, 1, 2, 3, 4, 0x06, 0x01, 'x'},
		{0x00, 0x01, 0xa1, 0x1f, 1, 2, 3, 4, 0x04, 0x01, 'y'},
	} {
		f.Add(seed, now, int64(now/w))
	}
	f.Fuzz(func(t *testing.T, data []byte, now, b int64) {
		var sb keyfoldv1.SeenBucket
		var wantErr error
		if len(data) > 0 && data[0] == packedPartMarker {
			sb.Ids, wantErr = packedPartIDs(data)
		} else {
			wantErr = proto.Unmarshal(data, &sb)
		}
		got := State{now: now}
		newest := newestRun{at: math.MinInt64}
		n, misplaced, err := p.loadPart(&got, data, b, &newest)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("loadPart(%x): error %v, proto.Unmarshal's %v", data, err, wantErr)
		}
		if err != nil {
			return
		}
		want := State{now: now}
		wantNewest := newestRun{at: math.MinInt64}
		p.loadIDs(&want, sb.Ids, &wantNewest)
		wantMisplaced := false
		for _, e := range sb.Ids {
			wantMisplaced = wantMisplaced || e.AtMs/w != b
		}
		if n != len(sb.Ids) || misplaced != wantMisplaced {
			t.Fatalf("loadPart(%x) = %d ids, misplaced %v; want %d, %v", data, n, misplaced, len(sb.Ids), wantMisplaced)
		}
		if newest != wantNewest {
			t.Fatalf("loadPart(%x) newest %+v; want %+v", data, newest, wantNewest)
		}
		g := idsOf(&got)
		if w := idsOf(&want); !slices.Equal(g, w) {
			t.Fatalf("loadPart(%x) left ids %v; want %v", data, g, w)
		}
		// An id stored twice with its one time (as parts written before
		// and after a layout change hold it) is kept once.
		seen := map[seenID]bool{}
		for _, e := range g {
			if seen[e] {
				t.Fatalf("loadPart(%x) kept %q at %d twice", data, e.id, e.at)
			}
			seen[e] = true
		}
		// Of ids that have one time each (as stored ids do), every one not
		// expired is kept, whatever their order.
		times := map[string]int64{}
		for _, e := range sb.Ids {
			id := e.Id
			switch {
			case id == "" && e.Fingerprint != 0:
				id = fpName(e.Fingerprint)
			case id == "":
				continue // never applied: not restored
			}
			if at, ok := times[id]; ok && at != e.AtMs {
				return
			}
			times[id] = e.AtMs
		}
		for id, at := range times {
			if at > now-p.dedupWindow.Milliseconds() && !seen[seenID{id, at}] {
				t.Fatalf("loadPart(%x) lost %q at %d", data, id, at)
			}
		}
	})
}

// packedPartIDs decodes a stored part's packed form (decode.go) as it is
// written down there and at appendIDEntry, for FuzzLoadPart to hold
// loadPart to: 0x00, the version (1 or 2), then per id a uvarint header
// whose low bit is set for a fingerprint; in version 2 its next bit set
// for a time difference from the previous id's (the first's from 0) in
// whole seconds in the bits above (at most 2^60 ms), else that difference
// in ms zigzagged in the bits above; in version 1 the bits above the low
// one the zigzag in ms; then the fingerprint (4 bytes, not 0) or the id's
// length (not 0) and bytes.
func packedPartIDs(data []byte) ([]*keyfoldv1.SeenID, error) {
	if len(data) < 2 || data[0] != 0 || (data[1] != 1 && data[1] != 2) {
		return nil, errors.New("not a packed part of version 1 or 2")
	}
	unzz := func(z uint64) int64 { return int64(z>>1) ^ -int64(z&1) }
	var ids []*keyfoldv1.SeenID
	at := int64(0)
	for b := data[2:]; len(b) > 0; {
		h, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, errors.New("bad header")
		}
		b = b[n:]
		switch {
		case data[1] == 1:
			at += unzz(h >> 1)
		case h&2 != 0:
			if h>>2 > (1<<60)/1000 {
				return nil, errors.New("time out of range")
			}
			at += int64(h>>2) * 1000
		default:
			at += unzz(h >> 2)
		}
		if h&1 == 1 {
			if len(b) < 4 || binary.LittleEndian.Uint32(b) == 0 {
				return nil, errors.New("bad fingerprint")
			}
			ids = append(ids, &keyfoldv1.SeenID{Fingerprint: binary.LittleEndian.Uint32(b), AtMs: at})
			b = b[4:]
			continue
		}
		l, n := binary.Uvarint(b)
		if n <= 0 || l == 0 || l > uint64(len(b)-n) {
			return nil, errors.New("bad id")
		}
		ids = append(ids, &keyfoldv1.SeenID{Id: string(b[n : n+int(l)]), AtMs: at})
		b = b[n+int(l):]
	}
	return ids, nil
}

// fpName names a fingerprint in idsOf's list (no id starts with a NUL:
// ids are text, but not empty, and tests do not use it).
func fpName(fp uint32) string { return fmt.Sprintf("\x00fp%08x", fp) }

// idsOf lists a state's ids and their times, oldest first; the ids the
// state holds as fingerprints by fpName.
func idsOf(s *State) []seenID {
	var out []seenID
	for c := s.ids.cursor(); c.more(); {
		id, at := c.next()
		if c.fp {
			out = append(out, seenID{fpName(binary.LittleEndian.Uint32(id)), at})
			continue
		}
		out = append(out, seenID{string(id), at})
	}
	return out
}

// TestStoredIDFormsArePinned: remembered ids are stored, packed (a key's
// packed state) and in bucket parts, so a state writes the same bytes in
// every build, and bytes of each older form read the same: a key
// remembering three ids as fingerprints (the store's index holds them) and
// one in full; the last part (8 ids) of a key remembering 40.
func TestStoredIDFormsArePinned(t *testing.T) {
	const (
		T = 1733355000000
		// The packed state: version 4 (ids as entries, times to the second
		// under this window), 3 (entries, times in ms), and 2.
		packedHex   = "060400d0c397c0f26404000004bd8214f79936bb0b9975cefc9b01e18fc95c06026534"
		packedV3Hex = "050400d0c397c0f264040000049f810af79936bbf12e9975cefc91b309e18fc95ca01f026534"
		packedV2Hex = "010400d0c397c0f2640400000400f79936bbd08005009975cefc98e90400e18fc95cd00f02653400"
		// The part: packed (version 2, and 1), and a SeenBucket message.
		partHex      = "0002e3b08eea19c9766770072affcaba07cdef61e707f59717ff07b4776ee107d664b8cf073baa747d075d2c63cd"
		partV1Hex    = "000181eeac80e5c901c9766770a11f2affcabaa11fcdef61e7a11ff59717ffa11fb4776ee1a11fd664b8cfa11f3baa747da11f5d2c63cd"
		partProtoHex = "0a0c10c09b8ba0b9321dc97667700a0c10a8a38ba0b9321d2affcaba0a0c1090ab8ba0b9321dcdef61e70a0c10f8b28ba0b9321df59717ff0a0c10e0ba8ba0b9321db4776ee10a0c10c8c28ba0b9321dd664b8cf0a0c10b0ca8ba0b9321d3baa747d0a0c1098d28ba0b9321d5d2c63cd"
	)
	p, err := Compile("p", Spec{Key: "k", ID: "id", DedupWindow: time.Hour, Aggregates: map[string]AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(s *State, id string, at int64) {
		ev, err := p.Prepare(fmt.Appendf(nil, `{"k":"a","id":%q}`, id))
		if err != nil {
			t.Fatal(err)
		}
		p.Apply(s, ev, at)
	}
	var s State
	apply(&s, "e1", T)
	apply(&s, "e2", T+1500)
	apply(&s, "e3", T+40000)
	parts, err := p.Snapshot(&s, 0, nil, SnapshotOptions{IDIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Persisted(parts.Version)
	apply(&s, "e4", T+41000)
	packed, err := p.AppendPacked(nil, &s)
	if err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(packed) != packedHex {
		t.Fatalf("the packed form changed: %x", packed)
	}
	// e2, applied at T+1500, is kept at T+2000 since version 4.
	want := []seenID{{fpName(Fingerprint("e1")), T}, {fpName(Fingerprint("e2")), T + 2000}, {fpName(Fingerprint("e3")), T + 40000}, {"e4", T + 41000}}
	wantV3 := slices.Clone(want)
	wantV3[1].at = T + 1500
	for _, h := range []string{packedHex, packedV3Hex, packedV2Hex} {
		want := want
		if h != packedHex {
			want = wantV3
		}
		b, _ := hex.DecodeString(h)
		got, err := p.UnpackState(b)
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if ids := idsOf(&got); !slices.Equal(ids, want) {
			t.Fatalf("%s reads as %v, want %v", h, ids, want)
		}
	}

	var s2 State
	for i := range 40 {
		apply(&s2, fmt.Sprint("e", i), T+int64(i)*1000)
	}
	parts, err = p.Snapshot(&s2, 0, nil, SnapshotOptions{IDIndex: true, PackedParts: true})
	if err != nil {
		t.Fatal(err)
	}
	last := parts.Buckets[len(parts.Buckets)-1]
	if last.Part != 1 || hex.EncodeToString(last.Data) != partHex {
		t.Fatalf("the packed part changed: part %d %x", last.Part, last.Data)
	}
	want = want[:0]
	for i := 32; i < 40; i++ {
		want = append(want, seenID{fpName(Fingerprint(fmt.Sprint("e", i))), T + int64(i)*1000})
	}
	for _, h := range []string{partHex, partV1Hex, partProtoHex} {
		b, _ := hex.DecodeString(h)
		got := State{now: T + 40000}
		newest := newestRun{at: math.MinInt64}
		n, misplaced, err := p.loadPart(&got, b, last.Bucket, &newest)
		if err != nil || n != 8 || misplaced {
			t.Fatalf("%s: %d ids, misplaced %v, %v", h, n, misplaced, err)
		}
		if ids := idsOf(&got); !slices.Equal(ids, want) {
			t.Fatalf("%s reads as %v, want %v", h, ids, want)
		}
	}
}
