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
	for round := range 200 {
		var s State
		events := rng.IntN(300)
		if round%2 == 0 {
			events = rng.IntN(inlineIDs + 4) // few ids: inline, or just spilled
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
			p.Apply(&s, ev, int64(1000+i*rng.IntN(60_000)))
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
			}
		} else {
			want.Seen = seenProto(&s.ids)
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
			var sb keyfoldv1.SeenBucket
			for _, e := range s.ids.list() {
				if e.at/w == b.Bucket {
					sb.Ids = append(sb.Ids, &keyfoldv1.SeenID{Id: e.id, AtMs: e.at})
				}
			}
			if wantB, _ := marshal.Marshal(&sb); !bytes.Equal(b.Data, wantB) {
				t.Fatalf("round %d bucket %d encoded as\n%x\nwant\n%x", round, b.Bucket, b.Data, wantB)
			}
		}
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
