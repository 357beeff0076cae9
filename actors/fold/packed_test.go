package fold_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/actors/fold/foldtest"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// packedSpecs are pipelines whose states pack positionally (aggregates
// only) and ones that pack as their snapshot's KeyState (sketches,
// windows and patterns).
func packedSpecs() map[string]fold.Spec {
	aggsOnly := fold.Spec{Key: "user_id", ID: "event_id", DedupWindow: 3 * time.Second, Aggregates: map[string]fold.AggregateSpec{}}
	sketches := aggsOnly
	sketches.Aggregates = map[string]fold.AggregateSpec{}
	for name, a := range fuzzSpec.Aggregates {
		sketches.Aggregates[name] = a
		if a.Op != "distinct" && a.Op != "quantiles" {
			aggsOnly.Aggregates[name] = a
		}
	}
	return map[string]fold.Spec{"aggregates": aggsOnly, "bench": foldtest.BenchSpec(), "sketches": sketches, "windows": fuzzSpec}
}

// TestPackedStateRestoresAsItsSnapshot: a state packed and unpacked is the
// state its snapshot restores (RestoreParts), field for field where no
// sketch is involved, and both
// go on alike; for numbers integral, fractional, negative and huge. A state
// whose ids spilled into buckets does not pack.
func TestPackedStateRestoresAsItsSnapshot(t *testing.T) {
	amounts := []string{"0", "1", "-7", "42", "0.1", "-2.5", "1e300", "9007199254740993", "-9007199254740992", "123456789012", "-0.0"}
	seeds := uint64(12)
	if raceDetector {
		seeds = 3
	}
	for name, spec := range packedSpecs() {
		p := mustCompile(t, spec)
		for seed := range seeds {
			t.Run(fmt.Sprintf("%s/%d", name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 2))
				var s fold.State
				now := int64(1_700_000_000_000)
				for i := range 300 {
					now += rng.Int64N(400)
					ev := prepare(t, p, fmt.Sprintf(`{"user_id":"k","event_id":"e%d","ts":%d,"type":%q,"amount":%s,"label":"l%d","geo":{"country":"c%d"}}`,
						rng.IntN(i+1), now-rng.Int64N(2000), [2]string{"login_ok", "login_failed"}[rng.IntN(2)], amounts[rng.IntN(len(amounts))], rng.IntN(5), rng.IntN(3)))
					p.Apply(&s, ev, now)
					if rng.IntN(7) != 0 {
						continue
					}
					packed, err := p.AppendPacked([]byte("prefix"), &s)
					if !s.OnePart() {
						if err == nil {
							t.Fatalf("event %d: a state with its ids in buckets packed", i)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					got, err := p.UnpackState(packed[len("prefix"):])
					if err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
					parts, err := p.SnapshotParts(&s, 0)
					if err != nil {
						t.Fatal(err)
					}
					want := restoreStored(t, p, parts)
					if !proto.Equal(stateProto(p, &got), stateProto(p, &want)) {
						t.Fatalf("event %d: unpacked state differs from the restored snapshot:\n got %v\nwant %v", i, stateProto(p, &got), stateProto(p, &want))
					}
					// Field for field, too, but for the sketches' insides
					// (two decodings of one sketch may differ in capacity).
					if strict := name == "aggregates" || name == "bench"; strict && !reflect.DeepEqual(got, want) {
						t.Fatalf("event %d: unpacked state differs from the restored snapshot:\n got %+v\nwant %+v", i, got, want)
					}
					for j := range 5 {
						ev := prepare(t, p, fmt.Sprintf(`{"user_id":"k","event_id":"x%d","ts":%d,"amount":3}`, rng.IntN(i+1)+j, now))
						if d1, d2 := p.Apply(&got, ev, now), p.Apply(&want, ev, now); d1 != d2 {
							t.Fatalf("event %d: duplicate %v unpacked, %v restored", i, d1, d2)
						}
					}
					if !proto.Equal(stateProto(p, &got), stateProto(p, &want)) {
						t.Fatalf("event %d: the unpacked and the restored state went on differently", i)
					}
				}
			})
		}
	}
}

// restoreStored restores a one-part snapshot as the host does: its core
// written to the store and read back.
func restoreStored(t *testing.T, p *fold.Pipeline, parts fold.Parts) fold.State {
	t.Helper()
	core, err := parts.CoreState()
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(core)
	if err != nil {
		t.Fatal(err)
	}
	var ks keyfoldv1.KeyState
	if err := proto.Unmarshal(data, &ks); err != nil {
		t.Fatal(err)
	}
	s, err := p.RestoreParts(&ks, func(b int64, _ int) ([]byte, error) {
		t.Fatalf("a one-part snapshot names id bucket %d", b)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPackedStateIsSmall: examples/bench.yaml's state packs positionally,
// in a third of its snapshot's core (what the snapshot cache is sized by).
func TestPackedStateIsSmall(t *testing.T) {
	p := mustCompile(t, foldtest.BenchSpec())
	var s fold.State
	for i := range 2 {
		p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"u123456","event_id":"e%d","type":"login_failed","amount":42,"geo":{"country":"DE"}}`, 1234567+i)), 1764633600000+int64(i))
	}
	packed, err := p.AppendPacked(nil, &s)
	if err != nil {
		t.Fatal(err)
	}
	core, err := p.AppendState(nil, &s)
	if err != nil {
		t.Fatal(err)
	}
	if len(packed)*2 > len(core) {
		t.Fatalf("packed %d bytes, the snapshot's core %d: want less than half", len(packed), len(core))
	}
}

// TestUnpackedStateIsFewObjects: a state unpacked holds its last values
// in one allocation and its ids in another, however many there are (each
// object a key holds is walked by every GC cycle), and does not keep the
// packed bytes (the cache's copy) alive through them.
func TestUnpackedStateIsFewObjects(t *testing.T) {
	p := mustCompile(t, foldtest.BenchSpec())
	allocs := map[int]float64{}
	for _, ids := range []int{1, 8} {
		var s fold.State
		for i := range ids {
			p.Apply(&s, prepare(t, p, fmt.Sprintf(`{"user_id":"u1","event_id":"event-%d","type":"login_failed","amount":42,"geo":{"country":"DE"}}`, i)), 1764633600000+int64(i))
		}
		packed, err := p.AppendPacked(nil, &s)
		if err != nil {
			t.Fatal(err)
		}
		allocs[ids] = testing.AllocsPerRun(100, func() {
			if _, err := p.UnpackState(packed); err != nil {
				t.Fatal(err)
			}
		})
		st, err := p.UnpackState(packed)
		if err != nil {
			t.Fatal(err)
		}
		clear(packed) // the unpacked state must not share it
		if got, want := p.Aggregates(&st), p.Aggregates(&s); !reflect.DeepEqual(got, want) {
			t.Fatalf("after its packed bytes changed, the unpacked state reads %v, want %v", got, want)
		}
		for i := range ids {
			ev := prepare(t, p, fmt.Sprintf(`{"user_id":"u1","event_id":"event-%d","amount":1}`, i))
			if dup := p.Apply(&st, ev, 1764633600000+int64(ids)); !dup {
				t.Fatalf("id event-%d lost after its packed bytes changed", i)
			}
		}
	}
	if allocs[8] != allocs[1] {
		t.Fatalf("unpacking allocates %v times with 1 id, %v with 8: want the same", allocs[1], allocs[8])
	}
}

// FuzzUnpackState: no input panics or allocates beyond its size; what
// unpacks (to ids inline) packs again to bytes that unpack to the same
// state.
func FuzzUnpackState(f *testing.F) {
	p := mustCompile(f, packedSpecs()["aggregates"])
	var s fold.State
	for i := range 3 {
		p.Apply(&s, prepare(f, p, fmt.Sprintf(`{"user_id":"k","event_id":"e%d","amount":%d.5,"label":"x"}`, i, i)), int64(1000+i))
		b, err := p.AppendPacked(nil, &s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// With the ids as fingerprints (the store's index holds them).
	parts, err := p.Snapshot(&s, 0, nil, fold.SnapshotOptions{IDIndex: true})
	if err != nil {
		f.Fatal(err)
	}
	s.Persisted(parts.Version)
	b, err := p.AppendPacked(nil, &s)
	if err != nil {
		f.Fatal(err)
	}
	if bytes.Contains(b, []byte("e1")) {
		f.Fatalf("packed with fingerprints, the state holds an id: %q", b)
	}
	f.Add(b)
	f.Add(b[:len(b)-2]) // a fingerprint cut short
	f.Add([]byte{2})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}) // a fingerprint of 0
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := p.UnpackState(data)
		if err != nil || !st.OnePart() { // (more ids than AppendPacked writes inline)
			return
		}
		again, err := p.AppendPacked(nil, &st)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := p.UnpackState(again)
		if err != nil {
			t.Fatalf("packed again, it does not unpack: %v", err)
		}
		if !proto.Equal(stateProto(p, &st), stateProto(p, &st2)) {
			t.Fatal("packed again, it unpacks to another state")
		}
	})
}
