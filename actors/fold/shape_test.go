package fold_test

import (
	"encoding/hex"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// TestUnpackShapedRestoresByName: a state packed by one configuration of a
// pipeline, read by another through the first one's shape, is the state
// the other restores from the first one's KeyState (by name and op:
// aggregates added start empty, removed ones are dropped, one whose op
// changed starts afresh, a renamed one is a new one; ids beyond a shorter
// dedup window are forgotten), also when the other no longer packs
// positionally (a window added). Read by its own configuration, it is
// UnpackState's state.
func TestUnpackShapedRestoresByName(t *testing.T) {
	base := packedSpecs()["aggregates"]
	with := func(change func(s *fold.Spec)) fold.Spec {
		s := base
		s.Aggregates = maps.Clone(base.Aggregates)
		change(&s)
		return s
	}
	later := map[string]fold.Spec{
		"same":    base,
		"added":   with(func(s *fold.Spec) { s.Aggregates["most"] = fold.AggregateSpec{Op: "max", Field: "amount"} }),
		"removed": with(func(s *fold.Spec) { delete(s.Aggregates, "biggest"); delete(s.Aggregates, "total") }),
		"op":      with(func(s *fold.Spec) { s.Aggregates["amount"] = fold.AggregateSpec{Op: "max", Field: "amount"} }),
		"renamed": with(func(s *fold.Spec) {
			s.Aggregates["place"] = s.Aggregates["country"]
			delete(s.Aggregates, "country")
		}),
		"where": with(func(s *fold.Spec) { s.Aggregates["failed"] = fold.AggregateSpec{Op: "count", Where: "amount > 1"} }),
		"window": with(func(s *fold.Spec) {
			s.Windows = map[string]fold.WindowSpec{"tumble": {Type: "tumbling", Size: 10 * time.Second}}
		}),
		"shorter": with(func(s *fold.Spec) { s.DedupWindow = 500 * time.Millisecond }),
		"none":    with(func(s *fold.Spec) { s.Aggregates = map[string]fold.AggregateSpec{"other": {Op: "count"}} }),
	}
	p := mustCompile(t, base)
	shape, id := p.Shape()
	if shape == nil || id != fold.ShapeID(shape) {
		t.Fatalf("Shape() = %x, %x", shape, id)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var s fold.State
	now := int64(1_700_000_000_000)
	checked := 0
	for i := range 200 {
		now += rng.Int64N(1200) // a few ids in the window: inline
		p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"k","event_id":"e%d","ts":%d,"type":%q,"amount":%d.25,"label":"l%d","geo":{"country":"c%d"}}`,
			rng.IntN(i+1), now, [2]string{"login_ok", "login_failed"}[rng.IntN(2)], rng.IntN(50)-10, rng.IntN(5), rng.IntN(3))), now)
		if i%20 != 19 || !s.OnePart() {
			continue
		}
		packed, err := p.AppendPacked(nil, &s)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := p.StateProto(&s)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for name, spec := range later {
			q, err := fold.Compile("fuzz", spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := q.UnpackShaped(shape, packed)
			if err != nil {
				t.Fatalf("event %d, %s: %v", i, name, err)
			}
			want, err := q.StateFromProto(ks)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(stateProto(q, &got), stateProto(q, &want)) {
				t.Fatalf("event %d, %s:\n got %v\nwant %v", i, name, stateProto(q, &got), stateProto(q, &want))
			}
			if name == "same" {
				if own, _ := q.UnpackState(packed); !proto.Equal(stateProto(q, &got), stateProto(q, &own)) {
					t.Fatalf("event %d: read by its own shape, not UnpackState's state", i)
				}
			}
		}
	}
	if checked < 5 {
		t.Fatalf("only %d states packed", checked)
	}
}

// TestShapeNamesAggregates: configurations that name the same aggregates
// (names and ops) have one shape whatever else differs; any change of a
// name or an op is another shape; a pipeline that does not pack
// positionally has none.
func TestShapeNamesAggregates(t *testing.T) {
	base := packedSpecs()["aggregates"]
	_, id := mustCompile(t, base).Shape()
	where := base
	where.Aggregates = maps.Clone(base.Aggregates)
	where.Aggregates["failed"] = fold.AggregateSpec{Op: "count", Where: "amount > 3"}
	where.DedupWindow = time.Hour
	if _, w := mustCompile(t, where).Shape(); w != id {
		t.Errorf("a filter and a dedup window changed the shape")
	}
	op := base
	op.Aggregates = maps.Clone(base.Aggregates)
	op.Aggregates["amount"] = fold.AggregateSpec{Op: "min", Field: "amount"}
	if _, o := mustCompile(t, op).Shape(); o == id {
		t.Errorf("an op changed, the shape did not")
	}
	if shape, sid := mustCompile(t, fuzzSpec).Shape(); shape != nil || sid != 0 {
		t.Errorf("a pipeline with windows and sketches has shape %x", shape)
	}
}

// FuzzUnpackShaped: no shape or state bytes panic; what they decode to
// encodes.
func FuzzUnpackShaped(f *testing.F) {
	p := mustCompile(f, packedSpecs()["aggregates"])
	q := mustCompile(f, packedSpecs()["bench"])
	shape, _ := p.Shape()
	var s fold.State
	for i := range 3 {
		p.Apply(&s, prepare(f, p, fmt.Sprintf(`{"user_id":"k","event_id":"e%d","amount":%d.5,"label":"x","geo":{"country":"c"}}`, i, i)), int64(1000+i))
		b, err := p.AppendPacked(nil, &s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(shape, b)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}, []byte{1, 0, 0, 0})
	f.Add([]byte{1, 1, 'a', 0}, []byte{1, 0, 0, 0, 1, 1, 0, 0})
	f.Fuzz(func(t *testing.T, shape, data []byte) {
		st, err := q.UnpackShaped(shape, data)
		if err != nil {
			return
		}
		if _, err := q.StateProto(&st); err != nil {
			t.Fatalf("unpacked a state that does not encode: %v", err)
		}
	})
}

// TestPackedFormatIsPinned: the packed form is stored (a key's snapshot,
// actors/packed.go), so a state packs to the same bytes in every build, and
// bytes a build stored read the same in every later one: these, of
// examples/bench.yaml's aggregates after three events (one a duplicate),
// and their shape. A change to either is a new fold.PackedVersion, which
// readers of older snapshots must tell apart, not a change of this test:
// the bytes of each older version are read here too.
func TestPackedFormatIsPinned(t *testing.T) {
	const (
		packedHex = "060201f0f192c0f264020100000000000023400002010000000000002940000200042246522201000002000002bcbb010265310a026532"
		shapeHex  = "0506616d6f756e740373756d0762696767657374036d617807636f756e747279046c617374066661696c656405636f756e7405746f74616c05636f756e74"
		// Version 3 (entries, their times in ms), written before ids' times
		// were kept to the second under a window of a minute or more.
		packedV3Hex = "050201f0f192c0f264020100000000000023400002010000000000002940000200042246522201000002000002de5d026531f02e026532"
		// Versions 1 and 2 (the ids as len id now-at).
		packedV2Hex = "010201f0f192c0f264020100000000000023400002010000000000002940000200042246522201000002000002026531f02e026532b817"
	)
	spec := fold.Spec{Key: "user_id", ID: "event_id", Aggregates: map[string]fold.AggregateSpec{
		"total":   {Op: "count"},
		"failed":  {Op: "count", Where: "type == 'login_failed'"},
		"amount":  {Op: "sum", Field: "amount"},
		"biggest": {Op: "max", Field: "amount"},
		"country": {Op: "last", Field: "geo.country"},
	}}
	p := mustCompile(t, spec)
	var s fold.State
	for i, ev := range []string{
		`{"user_id":"u1","event_id":"e1","type":"login_failed","amount":12.5,"geo":{"country":"DE"}}`,
		`{"user_id":"u1","event_id":"e2","type":"login_ok","amount":-3,"geo":{"country":"FR"}}`,
		`{"user_id":"u1","event_id":"e2","type":"login_ok","amount":100,"geo":{"country":"US"}}`,
	} {
		p.Apply(&s, prepare(t, p, ev), int64(1733355000000+i*1500))
	}
	packed, err := p.AppendPacked(nil, &s)
	if err != nil {
		t.Fatal(err)
	}
	shape, _ := p.Shape()
	if hex.EncodeToString(packed) != packedHex || hex.EncodeToString(shape) != shapeHex {
		t.Fatalf("the packed form changed:\npacked %x\nshape  %x", packed, shape)
	}
	// e2, applied 1.5 s after e1, is kept at 2 s since version 4.
	readsPinned(t, p, spec, packedHex, shapeHex, 1733355002000)
	for _, h := range []string{packedV3Hex, packedV2Hex} {
		readsPinned(t, p, spec, h, shapeHex, 1733355001500)
	}
}

// readsPinned checks that the pinned packed state stored (hex) reads as
// TestPackedFormatIsPinned's events left it, with its own shape and by
// name under another configuration.
func readsPinned(t *testing.T, p *fold.Pipeline, spec fold.Spec, storedHex, shapeHex string, e2At int64) {
	t.Helper()
	stored, _ := hex.DecodeString(storedHex)
	storedShape, _ := hex.DecodeString(shapeHex)
	got, err := p.UnpackShaped(storedShape, stored) // its own shape: positional
	if err != nil {
		t.Fatal(err)
	}
	ks := stateProto(p, &got)
	want := &keyfoldv1.KeyState{Seq: 2, Duplicates: 1, NowMs: 1733355003000, Aggregates: []*keyfoldv1.AggregateState{
		{Name: "amount", Op: "sum", Count: 2, Number: 9.5},
		{Name: "biggest", Op: "max", Count: 2, Number: 12.5},
		{Name: "country", Op: "last", Count: 2, LastJson: []byte(`"FR"`)},
		{Name: "failed", Op: "count", Count: 1},
		{Name: "total", Op: "count", Count: 2},
	}, Seen: []*keyfoldv1.SeenID{{Id: "e1", AtMs: 1733355000000}, {Id: "e2", AtMs: e2At}}}
	if !proto.Equal(ks, want) {
		t.Fatalf("stored bytes read as\n%v\nwant\n%v", ks, want)
	}
	// By name, under another configuration.
	other := spec
	other.Aggregates = map[string]fold.AggregateSpec{"total": {Op: "count"}, "country": {Op: "last", Field: "geo.country"}}
	q := mustCompile(t, other)
	got, err = q.UnpackShaped(storedShape, stored)
	if err != nil {
		t.Fatal(err)
	}
	want.Aggregates = []*keyfoldv1.AggregateState{want.Aggregates[2], want.Aggregates[4]}
	if ks := stateProto(q, &got); !proto.Equal(ks, want) {
		t.Fatalf("stored bytes read by name as\n%v\nwant\n%v", ks, want)
	}
}

// A shape naming an op whose state does not pack positionally (a sketch,
// or one this build does not know) is refused, not read as count, number
// and last value.
func TestShapeOfUnpackableOpRefused(t *testing.T) {
	p := mustCompile(t, packedSpecs()["aggregates"])
	var s fold.State
	p.Apply(&s, prepare(t, p, `{"user_id":"k","event_id":"e1","amount":3}`), 1000)
	packed, err := p.AppendPacked(nil, &s)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"distinct", "quantiles", "median"} {
		shape := append([]byte{1, 1, 'x', byte(len(op))}, op...)
		if _, err := p.UnpackShaped(shape, packed); err == nil || !strings.Contains(err.Error(), "does not pack") {
			t.Errorf("shape with op %s: %v", op, err)
		}
	}
}
