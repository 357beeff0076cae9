package actors

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// appendRecord writes what proto.Marshal writes for the same record, for
// records of every shape: keys with and without inputs, empty and long
// events, tombstones, expiry checks and calls with and without ids, join
// keys fed by their sides (not logged unless a timer of theirs is due), times of every size and sign, and
// watermarks.
func TestEncodeRecordIsProtoMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	times := []int64{0, 1, 127, 128, 1796126238867, -1, math.MaxInt64, math.MinInt64}
	for seed := range 500 {
		var keys []*keyBatch
		want := &keyfoldv1.LogRecord{}
		for k := range r.IntN(5) {
			kb := &keyBatch{id: keyID{pipeline: []string{"p", "logins", ""}[r.IntN(3)], key: string(rune('a'+k)) + string(make([]byte, r.IntN(200)))}}
			ki := &keyfoldv1.KeyInputs{Pipeline: kb.id.pipeline, Key: kb.id.key}
			for range r.IntN(3) {
				s := segment{nowMs: times[r.IntN(len(times))]}
				for range r.IntN(4) {
					ev := &fold.Event{Raw: bytes.Repeat([]byte("x"), []int{0, 1, 127, 128, 20000}[r.IntN(5)]), Erase: r.IntN(4) == 0, Expire: r.IntN(4) == 0,
						Call: r.IntN(3) == 0, ID: []string{"", "id-1", strings.Repeat("i", 200)}[r.IntN(3)]}
					s.events = append(s.events, ev)
					in := &keyfoldv1.Input{Event: ev.Raw, IngestTimeMs: s.nowMs, Erase: ev.Erase, Expire: ev.Expire, Call: ev.Call}
					if ev.Call {
						in.CallId = ev.ID
					}
					ki.Inputs = append(ki.Inputs, in)
				}
				kb.msg.segs = append(kb.msg.segs, s)
			}
			keys = append(keys, kb)
			want.Keys = append(want.Keys, ki)
			if r.IntN(3) == 0 { // a join's key fed by this one: logged only when its timer is due
				jb := &keyBatch{id: keyID{pipeline: "j", key: kb.id.key}, derived: true, fire: r.IntN(2) == 0}
				jb.msg.segs = append(jb.msg.segs, segment{events: []*fold.Event{{Raw: []byte("{}")}}, derived: true})
				keys = append(keys, jb)
				if jb.fire {
					want.Keys = append(want.Keys, &keyfoldv1.KeyInputs{Pipeline: "j", Key: kb.id.key})
				}
			}
		}
		for range r.IntN(3) {
			want.Watermarks = append(want.Watermarks, &keyfoldv1.Watermark{Pipeline: "p", WatermarkMs: times[r.IntN(len(times))], MaxEventMs: 5})
		}
		wantData, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		// Appended after what the buffer holds, in exactly the room it
		// needs: a miscounted size would grow the buffer.
		const prefix = "prefix"
		dst := append(make([]byte, 0, len(prefix)+len(wantData)), prefix...)
		got, err := appendRecord(dst, keys, want.Watermarks)
		if err != nil {
			t.Fatal(err)
		}
		if string(got[:len(prefix)]) != prefix || !bytes.Equal(got[len(prefix):], wantData) {
			t.Fatalf("seed %d: appendRecord differs from proto.Marshal:\n got %x\nwant %x", seed, got, wantData)
		}
		if &got[0] != &dst[0] {
			t.Fatalf("seed %d: the buffer grew: the size was miscounted", seed)
		}
	}
}
