package actors

import (
	"bytes"
	"strings"
	"testing"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// prependSnapshotHeader writes what proto.Marshal writes for the same
// Snapshot, for short and long keys.
func TestPrependSnapshotHeader(t *testing.T) {
	state, err := proto.Marshal(&keyfoldv1.KeyState{Seq: 3, NowMs: 1234, Aggregates: []*keyfoldv1.AggregateState{{Name: "n", Count: 3, Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pos uint64
		key string
	}{{0, "user-ü"}, {1, "u"}, {1 << 40, strings.Repeat("k", 300)}, {1<<64 - 1, ""}} {
		pos, id := c.pos, keyID{pipeline: "logins", key: c.key}
		var ks keyfoldv1.KeyState
		if err := proto.Unmarshal(state, &ks); err != nil {
			t.Fatal(err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&keyfoldv1.Snapshot{Pipeline: id.pipeline, Key: id.key, Position: pos, State: &ks})
		if err != nil {
			t.Fatal(err)
		}
		room := snapshotHeaderRoom(id)
		data := append(make([]byte, room), state...)
		if got := prependSnapshotHeader(data, room, id, pos); !bytes.Equal(got, want) {
			t.Errorf("position %d: %x, want %x", pos, got, want)
		}
	}
}
