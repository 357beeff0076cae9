package fold

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// TestDirectEncoding: the snapshot parts encoded field by field are the
// bytes proto.Marshal writes for the same messages, over random states of
// every aggregate op (sketches make messages longer than 127 bytes, whose
// length takes two bytes), with and without remembered ids, inline and in
// buckets.
func TestDirectEncoding(t *testing.T) {
	p, err := Compile("p", Spec{Key: "k", ID: "id", DedupWindow: time.Hour, Aggregates: map[string]AggregateSpec{
		"n":     {Op: "count"},
		"sum":   {Op: "sum", Field: "v"},
		"min":   {Op: "min", Field: "v"},
		"max":   {Op: "max", Field: "v"},
		"last":  {Op: "last", Field: "s"},
		"users": {Op: "distinct", Field: "s"},
		"q":     {Op: "quantiles", Field: "v", Where: "v > 0"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	marshal := proto.MarshalOptions{Deterministic: true}
	multipart := 0 // rounds with a bucket in more than one part
	for round := range 200 {
		var s State
		events := rng.IntN(300)
		spread := 60_000 // ms: ids over many buckets
		switch round % 4 {
		case 0, 2:
			events = rng.IntN(inlineIDs + 4) // few ids: inline, or just spilled
		case 1:
			spread = 50 // buckets of several parts
		}
		for i := range events {
			raw := fmt.Sprintf(`{"k":"a","id":"e%d","v":%d,"s":"%s"}`, rng.IntN(400), rng.IntN(2000)-1000, [3]string{"x", "", "a longer value"}[rng.IntN(3)])
			if rng.IntN(10) == 0 {
				raw = fmt.Sprintf(`{"k":"a","v":0.%d}`, i)
			}
			ev, err := p.Prepare([]byte(raw))
			if err != nil {
				t.Fatal(err)
			}
			p.Apply(&s, ev, int64(1000+i*rng.IntN(spread)))
		}
		parts, err := p.SnapshotParts(&s, 0)
		if err != nil {
			t.Fatal(err)
		}
		want, err := p.coreProto(&s)
		if err != nil {
			t.Fatal(err)
		}
		if s.ids.spilled {
			for _, bi := range s.ids.buckets {
				want.SeenBuckets = append(want.SeenBuckets, bi.bucket)
				want.SeenBucketParts = append(want.SeenBucketParts, uint32(partsOf(bi.added)))
			}
			if !s.ids.multipart() {
				want.SeenBucketParts = nil
			} else {
				multipart++
			}
			if len(want.SeenBuckets) > 0 {
				want.SeenPartIds = partIDs
			}
		} else {
			want.Seen = seenProto(&s.ids, 0)
		}
		wantData, err := marshal.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if parts.Core != nil || !bytes.Equal(parts.CoreData, wantData) {
			t.Fatalf("round %d: core encoded as\n%x\nwant\n%x", round, parts.CoreData, wantData)
		}
		w := p.bucketWidth()
		for _, b := range parts.Buckets {
			// The bucket's ids numbered into the part (all of a new
			// state's ids are numbered from 0 as added).
			var sb keyfoldv1.SeenBucket
			num := 0
			for _, e := range s.ids.list() {
				if e.at/w != b.Bucket {
					continue
				}
				if num/partIDs == b.Part {
					sb.Ids = append(sb.Ids, &keyfoldv1.SeenID{Id: e.id, AtMs: e.at})
				}
				num++
			}
			if wantB, _ := marshal.Marshal(&sb); !bytes.Equal(b.Data, wantB) {
				t.Fatalf("round %d bucket %d part %d encoded as\n%x\nwant\n%x", round, b.Bucket, b.Part, b.Data, wantB)
			}
		}
	}
	if multipart == 0 {
		t.Error("no round stored a bucket in more than one part")
	}
}

// endMessage moves a message whose length needs more than one byte.
func TestEndMessage(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 16383, 16384, 70000} {
		b := []byte("prefix")
		b, mark := beginMessage(b)
		body := bytes.Repeat([]byte{7}, n)
		b = endMessage(append(b, body...), mark)
		want := append([]byte("prefix"), protowireBytes(body)...)
		if !bytes.Equal(b, want) {
			t.Errorf("message of %d bytes: encoded %d bytes, want %d", n, len(b), len(want))
		}
	}
}

func protowireBytes(body []byte) []byte {
	var b []byte
	n := uint64(len(body))
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(append(b, byte(n)), body...)
}
