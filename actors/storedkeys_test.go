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

// checkpointKeys has f add the keys as a checkpoint to position 1 writing
// their snapshots would, and returns what that checkpoint wrote besides
// them.
func checkpointKeys(f *storedKeys, keys ...keyID) (filterRecords []persistence.Snapshot, layers []int) {
	var d persistence.CheckpointData
	for _, id := range keys {
		d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: id.snapshotKey(), Data: []byte("state")})
	}
	n := len(d.Snapshots)
	layers = f.addWritten(&d, 1)
	return d.Snapshots[n:], layers
}

// claimedStore is an in-memory store whose group 0 is claimed.
func claimedStore(t *testing.T) (*memstore.Store, persistence.GroupState) {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	st, err := store.Claim(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return store, st
}

// keyNames are n keys of pipeline p.
func keyNames(prefix string, n int) []keyID {
	ids := make([]keyID, n)
	for i := range ids {
		ids[i] = keyID{"p", fmt.Sprintf("%s-%d", prefix, i)}
	}
	return ids
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
	ids := keyNames("key", keys)
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

	// Keys it holds already change no layer (the header names the
	// checkpoint's position: it is always written); a new one, the last.
	if recs, layers := checkpointKeys(f, ids[:100]...); len(recs) != 1 || len(layers) != 0 {
		t.Errorf("keys held already wrote %d records", len(recs))
	}
	if recs, layers := checkpointKeys(f, keyID{"q", "new"}); len(layers) != 1 || layers[0] != 6 || len(recs) != 2 {
		t.Errorf("a new key wrote layers %v (%d records), want the last one and the header", layers, len(recs))
	}

	// Written (everything) and read back.
	ctx := context.Background()
	store, st := claimedStore(t)
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
	// One of an earlier checkpoint than the group's last (written by a
	// keyfold without the filter since): not used.
	if g, err := loadStoredKeys(ctx, store, 0, 2); !errors.Is(err, errStaleFilter) || g != nil {
		t.Errorf("a filter of an earlier checkpoint: %v, %v", g, err)
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

// A group that outgrows its filter drops it: every key may be stored, its
// layers are deleted from the store, and a take-over reads none.
func TestStoredKeysFilterFull(t *testing.T) {
	f := newStoredKeys()
	capacity := 0
	for i := range maxFilterLayers {
		capacity += layerCapacity(i)
	}
	// (Keys it takes for held already, false positives, are not counted:
	// it fills at a little more than its capacity.)
	var recs []persistence.Snapshot
	added, most := 0, 0
	for !f.full.Load() {
		var layers []int
		most = max(most, len(*f.layers.Load()))
		recs, layers = checkpointKeys(f, keyNames(fmt.Sprintf("k%d", added), 4096)...)
		f.saved(layers)
		if added += 4096; added > 2*capacity {
			t.Fatalf("%d keys added, not full", added)
		}
	}
	if added < capacity || most != maxFilterLayers {
		t.Fatalf("full after %d keys (%d layers), want %d keys in %d layers", added, most, capacity, maxFilterLayers)
	}
	if f.bytes() != 0 || !f.mayHave(keyID{"p", "anything"}) {
		t.Fatalf("full: %d B, holds every key %v", f.bytes(), f.mayHave(keyID{"p", "anything"}))
	}
	deleted := 0
	for _, r := range recs {
		if r.Data == nil {
			deleted++
		}
	}
	if deleted != maxFilterLayers || len(recs) != maxFilterLayers+1 {
		t.Fatalf("wrote %d records, %d deletes; want every layer deleted and the header", len(recs), deleted)
	}
	ctx := context.Background()
	store, st := claimedStore(t)
	if err := store.Checkpoint(ctx, 0, st.Epoch, persistence.CheckpointData{Snapshots: recs}); err != nil {
		t.Fatal(err)
	}
	if g, err := loadStoredKeys(ctx, store, 0, 1); err != nil || g != nil {
		t.Errorf("a full filter read back: %v, %v; want none", g, err)
	}
	if recs, _ := checkpointKeys(f, keyID{"p", "later"}); len(recs) != 1 {
		t.Errorf("a full filter's next checkpoint wrote %d records, want the header", len(recs))
	}
}
