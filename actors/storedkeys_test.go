package actors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/memstore"
)

// checkpointKeys has f add the keys as a checkpoint writing their snapshots
// would, and returns what that checkpoint wrote besides them.
func checkpointKeys(f *storedKeys, keys ...keyID) (filterRecords []persistence.Snapshot, layers []int) {
	var d persistence.CheckpointData
	for _, id := range keys {
		d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: id.snapshotKey(), Data: []byte("state")})
	}
	n := len(d.Snapshots)
	layers = f.addWritten(&d)
	return d.Snapshots[n:], layers
}

// The filter holds every key added, across its layers, and few others;
// a checkpoint writes only the layers that changed, and the filter read
// back from a store is the one written.
func TestStoredKeysFilter(t *testing.T) {
	f := newStoredKeys()
	if f.mayHave(keyID{"p", "a"}) {
		t.Fatal("an empty filter holds a key")
	}
	const keys = 60_000 // 1k + 2k + 4k + 8k + 16k + 16k + 16k(part): seven layers
	ids := make([]keyID, keys)
	for i := range ids {
		ids[i] = keyID{"p", fmt.Sprintf("key-%d", i)}
	}
	recs, layers := checkpointKeys(f, ids...)
	if n := len(*f.layers.Load()); n != 7 || len(layers) != 7 || len(recs) != 8 {
		t.Fatalf("%d layers, %d written (%d records), want 7, 7 and the header", n, len(layers), len(recs))
	}
	for _, id := range ids {
		if !f.mayHave(id) {
			t.Fatalf("%v added, not held", id)
		}
	}
	falsePositives := 0
	for i := range keys {
		if f.mayHave(keyID{"p", fmt.Sprintf("other-%d", i)}) {
			falsePositives++
		}
	}
	// (Seven layers of ~0.4% each.)
	if rate := float64(falsePositives) / keys; rate > 0.04 {
		t.Errorf("%.2f%% of keys never added are held, want under 4%%", 100*rate)
	}
	f.saved(layers)

	// Keys it holds already change nothing; a new one, the last layer.
	if recs, layers := checkpointKeys(f, ids[:100]...); len(recs) != 0 || len(layers) != 0 {
		t.Errorf("keys held already wrote %d records", len(recs))
	}
	if recs, layers := checkpointKeys(f, keyID{"q", "new"}); len(layers) != 1 || layers[0] != 6 || len(recs) != 2 {
		t.Errorf("a new key wrote layers %v (%d records), want the last one and the header", layers, len(recs))
	}

	// Written (everything) and read back.
	ctx := context.Background()
	store := memstore.New()
	defer store.Close()
	st, err := store.Claim(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range f.unsaved {
		f.unsaved[i] = true
	}
	recs, _ = checkpointKeys(f)
	if err := store.Checkpoint(ctx, 0, st.Epoch, persistence.CheckpointData{Snapshots: recs}); err != nil {
		t.Fatal(err)
	}
	g, err := loadStoredKeys(ctx, store, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range append(ids, keyID{"q", "new"}) {
		if !g.mayHave(id) {
			t.Fatalf("%v not held after the filter was read back", id)
		}
	}
	if fmt.Sprint(g.counts) != fmt.Sprint(f.counts) || g.bytes() != f.bytes() {
		t.Errorf("read back: counts %v, %d B; written %v, %d B", g.counts, g.bytes(), f.counts, f.bytes())
	}
	// A group with no filter: empty if it was never checkpointed, unknown
	// (nil, every key may be stored) if an older keyfold checkpointed it.
	if g, err := loadStoredKeys(ctx, store, 1, 0); err != nil || g == nil || g.mayHave(ids[0]) {
		t.Errorf("never checkpointed: %v, %v", g, err)
	}
	if g, err := loadStoredKeys(ctx, store, 1, 5); err != nil || g != nil || !g.mayHave(ids[0]) {
		t.Errorf("checkpointed without a filter: %v, %v", g, err)
	}
	// One that does not decode is an error (the host reports it and reads
	// every key).
	bad := append([]byte(nil), recs[0].Data...)
	bad[1]++ // the capacity
	if err := store.Checkpoint(ctx, 0, st.Epoch, persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: recs[0].Key, Data: bad}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := loadStoredKeys(ctx, store, 0, 1); !errors.Is(err, errFilter) {
		t.Errorf("a corrupt layer read: %v", err)
	}
}

func TestIsKeySnapshot(t *testing.T) {
	id := keyID{"pipe", "key"}
	for name, want := range map[string]bool{
		id.snapshotKey():    true,
		id.bucketKey(7, 0):  false,
		id.bucketKey(7, 2):  false,
		groupClockKey:       false,
		storedKeysKey:       false,
		filterLayerKey(3):   false,
		"pipe\x00":          true, // an empty key is still a key
		"no-separator-here": false,
	} {
		if got := isKeySnapshot(name); got != want {
			t.Errorf("isKeySnapshot(%q) = %v", name, got)
		}
	}
}

// A stored layer that decodes re-encodes to the same bytes; any other is an
// error, not a panic.
func FuzzDecodeLayer(f *testing.F) {
	l := newFilterLayer(layerCapacity(0))
	l.set(hashKey(keyID{"p", "k"}))
	f.Add(0, l.encode(1))
	f.Add(1, newFilterLayer(layerCapacity(1)).encode(0))
	f.Add(0, []byte{filterVersion})
	f.Add(0, []byte{})
	f.Fuzz(func(t *testing.T, i int, data []byte) {
		if i < 0 || i > 64 {
			return
		}
		l, count, err := decodeLayer(i, data)
		if err != nil {
			if !errors.Is(err, errFilter) {
				t.Fatalf("error %v does not wrap errFilter", err)
			}
			return
		}
		if again := l.encode(count); !bytes.Equal(again, data) {
			t.Fatalf("decoded layer re-encodes differently")
		}
	})
}
