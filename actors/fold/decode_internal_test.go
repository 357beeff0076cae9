package fold

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
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
	f.Fuzz(func(t *testing.T, data []byte, now, b int64) {
		var sb keyfoldv1.SeenBucket
		wantErr := proto.Unmarshal(data, &sb)
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
