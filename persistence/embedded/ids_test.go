package embedded

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/keyfold/keyfold/persistence"
)

const idT0 = int64(1_700_000_000_000)

func lookUp(t *testing.T, s *Store, g uint32, ls ...persistence.IDLookup) []int64 {
	t.Helper()
	at, err := s.LookupIDs(t.Context(), g, ls)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func checkpointIDs(t *testing.T, s *Store, g uint32, ep persistence.Epoch, drop int64, ids ...persistence.StoredID) {
	t.Helper()
	if err := s.Checkpoint(t.Context(), g, ep, persistence.CheckpointData{DropIDsBefore: drop, IDs: ids}); err != nil {
		t.Fatal(err)
	}
}

// TestIDIndexOfFormat6: the ids a format 6 store indexed in the store's
// Pebble are found after the move to the current format, beside the ids
// stored since (in the index's own Pebble), go with the drops, and once
// none is left the store's Pebble is no longer read for them.
func TestIDIndexOfFormat6(t *testing.T) {
	dir := t.TempDir()
	s := openSmall(t, dir, 512)
	ep := claim(t, s, 1, 2)
	b := s.db.NewBatch()
	for bucket := range int64(4) {
		for g := uint32(1); g <= 2; g++ {
			_ = b.Set(idKey(g, bucket, "k", "old"), encodeUint64(uint64(idT0+bucket)), nil)
		}
	}
	_ = b.Set(metaFormatKey, encodeUint64(6), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openSmall(t, dir, 512)
	defer func() { _ = s.Close() }()
	if !s.legacyIDs {
		t.Fatal("the ids of format 6 not found at open")
	}
	ls := []persistence.IDLookup{{Bucket: 0, Key: "k", ID: "old"}, {Bucket: 3, Key: "k", ID: "old"}, {Bucket: 3, Key: "k", ID: "new"}}
	if got := lookUp(t, s, 1, ls...); !slices.Equal(got, []int64{idT0, idT0 + 3, 0}) {
		t.Errorf("format 6 ids after the move = %v", got)
	}
	// Stored again: the later time, from the new index.
	checkpointIDs(t, s, 1, ep[1], 0, persistence.StoredID{Bucket: 3, Key: "k", ID: "new", At: idT0 + 30}, persistence.StoredID{Bucket: 3, Key: "k", ID: "old", At: idT0 + 31})
	if got := lookUp(t, s, 1, ls...); !slices.Equal(got, []int64{idT0, idT0 + 31, idT0 + 30}) {
		t.Errorf("format 6 ids and new ones = %v", got)
	}
	checkpointIDs(t, s, 1, ep[1], 3)
	if got := lookUp(t, s, 1, ls...); !slices.Equal(got, []int64{0, idT0 + 31, idT0 + 30}) {
		t.Errorf("after group 1's drop below 3: %v", got)
	}
	if got := lookUp(t, s, 2, ls...); !slices.Equal(got, []int64{idT0, idT0 + 3, 0}) {
		t.Errorf("group 2 after group 1's drop: %v", got)
	}
	checkpointIDs(t, s, 1, ep[1], 4)
	checkpointIDs(t, s, 2, ep[2], 4)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openSmall(t, dir, 512)
	if s.legacyIDs {
		t.Error("the store's Pebble is still read for ids after every group dropped them")
	}
	if got := lookUp(t, s, 1, ls...); !slices.Equal(got, []int64{0, 0, 0}) {
		t.Errorf("after the drops below 4: %v", got)
	}
}

// TestIDsPendingAcrossACrash: a crash after a checkpoint's batch committed
// and before its ids were in the index loses none of them: the next
// opening writes them from the pending entry (and drops what the
// checkpoint dropped). The crash is a copy of the store's files taken at
// that moment, every write before it synced.
func TestIDsPendingAcrossACrash(t *testing.T) {
	dir := t.TempDir()
	s := openSmall(t, dir, 512)
	ep := claim(t, s, 1)
	checkpointIDs(t, s, 1, ep[1], 0, persistence.StoredID{Bucket: 1, Key: "k", ID: "dropped", At: idT0})
	image := filepath.Join(t.TempDir(), "image")
	s.testHookIndex = func(uint32) {
		if err := os.CopyFS(image, os.DirFS(dir)); err != nil {
			t.Error(err)
		}
	}
	checkpointIDs(t, s, 1, ep[1], 2, persistence.StoredID{Bucket: 5, Key: "k", ID: "a", At: idT0 + 5}, persistence.StoredID{Bucket: 6, Key: "k", ID: "b", At: idT0 + 6})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(image, "LOCK"))
	_ = os.Remove(filepath.Join(image, idsDir, "LOCK"))

	c := openSmall(t, image, 512)
	defer func() { _ = c.Close() }()
	ls := []persistence.IDLookup{{Bucket: 1, Key: "k", ID: "dropped"}, {Bucket: 5, Key: "k", ID: "a"}, {Bucket: 6, Key: "k", ID: "b"}}
	if got := lookUp(t, c, 1, ls...); !slices.Equal(got, []int64{0, idT0 + 5, idT0 + 6}) {
		t.Errorf("ids after the crash = %v, want [0 %d %d]", got, idT0+5, idT0+6)
	}
	if _, closer, err := c.db.Get(pendingIDsKey(1)); !errors.Is(err, pebble.ErrNotFound) {
		if err == nil {
			closer.Close()
		}
		t.Errorf("pending entry after the opening wrote it: %v, want none", err)
	}
}

// TestIDsFoundOnceSnapshotsAre: a look-up of a group whose checkpoint
// committed its batch waits until the index holds the checkpoint's ids,
// as with one batch: a key read back from its new snapshot finds its ids.
func TestIDsFoundOnceSnapshotsAre(t *testing.T) {
	s := openSmall(t, t.TempDir(), 512)
	defer func() { _ = s.Close() }()
	ep := claim(t, s, 1)
	l := persistence.IDLookup{Bucket: 5, Key: "k", ID: "a"}
	var wg sync.WaitGroup
	var got []int64
	s.testHookIndex = func(uint32) {
		done := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(done)
			at, err := s.LookupIDs(t.Context(), 1, []persistence.IDLookup{l})
			if err != nil {
				t.Error(err)
			}
			got = at
		}()
		// Long enough for a look-up that does not wait to return.
		select {
		case <-done:
		case <-time.After(200 * time.Millisecond):
		}
	}
	checkpointIDs(t, s, 1, ep[1], 0, persistence.StoredID{Bucket: 5, Key: "k", ID: "a", At: idT0})
	wg.Wait()
	if !slices.Equal(got, []int64{idT0}) {
		t.Errorf("look-up during the checkpoint = %v, want [%d]", got, idT0)
	}
}

// TestIDIndexSweep: the buckets below the lowest one any group holds ids in
// (after drops, or where a group's ids all expired) are cut out of the
// index's tables; the buckets above stay, also after a reopen.
func TestIDIndexSweep(t *testing.T) {
	dir := t.TempDir()
	s := openSmall(t, dir, 512)
	ep := claim(t, s, 1, 2, 3)
	future := time.Now().Add(time.Hour).UnixMilli()
	for bucket := int64(1); bucket <= 6; bucket++ {
		for g := uint32(1); g <= 2; g++ {
			checkpointIDs(t, s, g, ep[g], 0, persistence.StoredID{Bucket: bucket, Key: "k", ID: "x", At: idT0 + bucket, Expires: future})
		}
	}
	// Group 3's ids have expired: they hold back no sweep.
	checkpointIDs(t, s, 3, ep[3], 0, persistence.StoredID{Bucket: 0, Key: "k", ID: "x", At: idT0, Expires: time.Now().Add(-time.Minute).UnixMilli()})
	if err := s.ids.db.Flush(); err != nil {
		t.Fatal(err)
	}
	checkpointIDs(t, s, 1, ep[1], 4)
	if s.ids.cut != 1 {
		t.Errorf("cut below %d, want 1 (group 2 holds bucket 1, group 3's bucket 0 expired)", s.ids.cut)
	}
	checkpointIDs(t, s, 2, ep[2], 3)
	if s.ids.cut != 3 {
		t.Errorf("cut below %d, want 3 (group 2 holds bucket 3)", s.ids.cut)
	}
	// An excise of a span the memtable overlaps (the drops' range
	// deletions) takes effect on the tables at the memtable's flush.
	if err := s.ids.db.Flush(); err != nil {
		t.Fatal(err)
	}
	smallest := func() []byte {
		t.Helper()
		var low []byte
		tables, err := s.ids.db.SSTables()
		if err != nil {
			t.Fatal(err)
		}
		for _, level := range tables {
			for _, tb := range level {
				if k := tb.Smallest.UserKey; k[0] == kindIndexedID && (low == nil || bytes.Compare(k, low) < 0) {
					low = k
				}
			}
		}
		return low
	}
	if low := smallest(); bytes.Compare(low, indexedIDGroupKey(nil, 3, 0)) < 0 {
		t.Errorf("a table holds ids from %x, below bucket 3", low)
	}
	ls := []persistence.IDLookup{{Bucket: 2, Key: "k", ID: "x"}, {Bucket: 3, Key: "k", ID: "x"}, {Bucket: 4, Key: "k", ID: "x"}}
	check := func() {
		t.Helper()
		if got := lookUp(t, s, 1, ls...); !slices.Equal(got, []int64{0, 0, idT0 + 4}) {
			t.Errorf("group 1 = %v", got)
		}
		if got := lookUp(t, s, 2, ls...); !slices.Equal(got, []int64{0, idT0 + 3, idT0 + 4}) {
			t.Errorf("group 2 = %v", got)
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openSmall(t, dir, 512)
	defer func() { _ = s.Close() }()
	check()
}

// FuzzDecodePendingIDs: whatever the bytes, decoding does not panic, and
// what it accepts encodes to bytes that decode to the same (the encoding
// is minimal, the decoding accepts longer varints).
func FuzzDecodePendingIDs(f *testing.F) {
	f.Add(appendPendingIDs(nil, 3, []persistence.StoredID{{Bucket: 1, Key: "k", ID: "a", At: idT0, Expires: idT0 + 1}}))
	f.Add(appendPendingIDs(nil, 0, nil))
	f.Add([]byte{0, 200, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		drop, ids, err := decodePendingIDs(b)
		if err != nil {
			return
		}
		again := appendPendingIDs(nil, drop, ids)
		drop2, ids2, err := decodePendingIDs(again)
		if err != nil || drop2 != drop || !slices.Equal(ids2, ids) {
			t.Fatalf("decoded %d %v from %x, which encodes to %x, decoded as %d %v, %v", drop, ids, b, again, drop2, ids2, err)
		}
	})
}
