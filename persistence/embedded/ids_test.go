package embedded

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
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

// TestIDIndexSweep: the buckets no group holds ids in any more (each
// dropped them, or a group's ids there expired) are cut out of the index's
// tables, whole tables where they hold nothing else; the buckets a group
// holds stay, also after a reopen.
func TestIDIndexSweep(t *testing.T) {
	dir := t.TempDir()
	s := openSmall(t, dir, 512)
	ep := claim(t, s, 1, 2, 3)
	future := time.Now().Add(time.Hour).UnixMilli()
	// Group 3's ids have expired: they hold back no sweep.
	checkpointIDs(t, s, 3, ep[3], 0, persistence.StoredID{Bucket: 0, Key: "k", ID: "x", At: idT0, Expires: time.Now().Add(-time.Minute).UnixMilli()})
	for bucket := int64(1); bucket <= 6; bucket++ {
		for g := uint32(1); g <= 2; g++ {
			checkpointIDs(t, s, g, ep[g], 0, persistence.StoredID{Bucket: bucket, Key: "k", ID: "x", At: idT0 + bucket, Expires: future})
		}
		if err := s.ids.db.Flush(); err != nil { // a table a bucket
			t.Fatal(err)
		}
	}
	// The buckets the index's tables hold ids in.
	tables := func() []int64 {
		t.Helper()
		if err := s.ids.db.Flush(); err != nil {
			t.Fatal(err)
		}
		levels, err := s.ids.db.SSTables()
		if err != nil {
			t.Fatal(err)
		}
		var buckets []int64
		for _, level := range levels {
			for _, tb := range level {
				for b := int64(binary.BigEndian.Uint64(tb.Smallest.UserKey[1:])); b <= int64(binary.BigEndian.Uint64(tb.Largest.UserKey[1:])); b++ {
					buckets = append(buckets, b)
				}
			}
		}
		slices.Sort(buckets)
		return slices.Compact(buckets)
	}
	if got := tables(); !slices.Equal(got, []int64{0, 1, 2, 3, 4, 5, 6}) {
		t.Fatalf("tables hold buckets %v before a drop", got)
	}
	checkpointIDs(t, s, 1, ep[1], 4)
	if got := tables(); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) {
		t.Errorf("tables hold buckets %v after group 1's drop below 4, want 1-6 (group 2 holds 1-6, group 3's bucket 0 expired)", got)
	}
	checkpointIDs(t, s, 2, ep[2], 3)
	if got := tables(); !slices.Equal(got, []int64{3, 4, 5, 6}) {
		t.Errorf("tables hold buckets %v after group 2's drop below 3, want 3-6", got)
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
	// A group's ids stored again below its drop are held again; once
	// dropped again they are cut out.
	checkpointIDs(t, s, 1, ep[1], 0, persistence.StoredID{Bucket: 2, Key: "k", ID: "late", At: idT0 + 20, Expires: future})
	if got := lookUp(t, s, 1, persistence.IDLookup{Bucket: 2, Key: "k", ID: "late"}); !slices.Equal(got, []int64{idT0 + 20}) {
		t.Errorf("an id stored below the group's drop = %v", got)
	}
	if got := tables(); !slices.Equal(got, []int64{2, 3, 4, 5, 6}) {
		t.Errorf("tables hold buckets %v, want 2-6", got)
	}
	checkpointIDs(t, s, 1, ep[1], 4)
	if got := tables(); !slices.Equal(got, []int64{3, 4, 5, 6}) {
		t.Errorf("tables hold buckets %v after the drop again, want 3-6", got)
	}
}

// TestIDExpiryByTheStoresClock: the sweep judges the ids' Expires by
// Options.Now, not the wall clock: ids that expire an hour after the
// store's clock (years before the wall clock's) stay found through another
// group's drop, and go once the store's clock passes their expiry.
func TestIDExpiryByTheStoresClock(t *testing.T) {
	var clock atomic.Int64
	clock.Store(idT0)
	s, err := Open(t.TempDir(), Options{Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ep := claim(t, s, 1, 2)
	hour := time.Hour.Milliseconds()
	checkpointIDs(t, s, 1, ep[1], 0, persistence.StoredID{Bucket: 10, Key: "k", ID: "x", At: idT0, Expires: idT0 + hour})
	checkpointIDs(t, s, 2, ep[2], 0, persistence.StoredID{Bucket: 1, Key: "k", ID: "y", At: idT0, Expires: idT0 + 4*hour})
	x := persistence.IDLookup{Bucket: 10, Key: "k", ID: "x"}
	checkpointIDs(t, s, 2, ep[2], 2) // a drop: a sweep
	if got := lookUp(t, s, 1, x); !slices.Equal(got, []int64{idT0}) {
		t.Fatalf("an id an hour from expiring by the store's clock, after a sweep = %v, want [%d]", got, idT0)
	}
	clock.Add(2 * hour)
	checkpointIDs(t, s, 2, ep[2], 3)
	if got := lookUp(t, s, 1, x); !slices.Equal(got, []int64{0}) {
		t.Errorf("an id expired by the store's clock, after a sweep = %v, want [0]", got)
	}
}

// TestIDDrops: a group's drops as look-ups apply them, against the rule
// they implement: an id stored in generation g of bucket b is dropped iff
// a later drop was above b. Drops in random order, as the model says.
func TestIDDrops(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		var d idDrops
		var marks []int64 // marks[k-1]: drop k's bucket
		for range rng.IntN(8) {
			b := int64(rng.IntN(10))
			d = d.add(b)
			marks = append(marks, b)
			back, err := decodeIDDrops(d.append(nil))
			if err != nil || back.gen != d.gen || !slices.Equal(back.points, d.points) {
				t.Fatalf("drops %+v decode as %+v, %v", d, back, err)
			}
		}
		for gen := uint64(0); gen <= d.gen; gen++ {
			for b := int64(0); b < 11; b++ {
				want := false
				for k := gen + 1; k <= uint64(len(marks)); k++ {
					want = want || marks[k-1] > b
				}
				if got := d.dropped(b, gen); got != want {
					t.Fatalf("marks %v: dropped(bucket %d, gen %d) = %v, want %v", marks, b, gen, got, want)
				}
			}
		}
	}
}

// FuzzDecodePendingIDs: whatever the bytes, decoding does not panic, and
// what it accepts encodes to bytes that decode to the same (the encoding
// is minimal, the decoding accepts longer varints), of the length
// pendingIDsSize says (the checkpoint writes them in place).
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
		if n := pendingIDsSize(drop, ids); n != len(again) {
			t.Fatalf("%d %v: sized %d bytes, encoded in %d", drop, ids, n, len(again))
		}
		drop2, ids2, err := decodePendingIDs(again)
		if err != nil || drop2 != drop || !slices.Equal(ids2, ids) {
			t.Fatalf("decoded %d %v from %x, which encodes to %x, decoded as %d %v, %v", drop, ids, b, again, drop2, ids2, err)
		}
	})
}

// FuzzDecodeIDDrops: whatever the bytes, decoding does not panic, and what
// it accepts is a staircase that encodes to bytes decoding to the same.
func FuzzDecodeIDDrops(f *testing.F) {
	f.Add(idDrops{}.add(5).add(3).append(nil))
	f.Add([]byte{2, 2, 1, 9, 2, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeIDDrops(b)
		if err != nil {
			return
		}
		back, err := decodeIDDrops(d.append(nil))
		if err != nil || back.gen != d.gen || !slices.Equal(back.points, d.points) {
			t.Fatalf("decoded %+v from %x, which decodes back as %+v, %v", d, b, back, err)
		}
	})
}
