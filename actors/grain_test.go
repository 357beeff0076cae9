package actors

import (
	"bytes"
	"testing"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// appendSnapshot writes what proto.Marshal writes for the same Snapshot.
func TestAppendSnapshot(t *testing.T) {
	state, err := proto.Marshal(&keyfoldv1.KeyState{Seq: 3, NowMs: 1234, Aggregates: []*keyfoldv1.AggregateState{{Name: "n", Count: 3, Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, pos := range []uint64{0, 1, 1 << 40} {
		id := keyID{pipeline: "logins", key: "user-ü"}
		var ks keyfoldv1.KeyState
		if err := proto.Unmarshal(state, &ks); err != nil {
			t.Fatal(err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&keyfoldv1.Snapshot{Pipeline: id.pipeline, Key: id.key, Position: pos, State: &ks})
		if err != nil {
			t.Fatal(err)
		}
		if got := appendSnapshot(nil, id, pos, state); !bytes.Equal(got, want) {
			t.Errorf("position %d: %x, want %x", pos, got, want)
		}
	}
}
