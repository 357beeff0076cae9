package embedded

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable/block"
	"github.com/keyfold/keyfold/persistence"
)

// A checkpoint deletes exactly the records it covers: one by one for a short
// stretch (no range deletion, which would slow every point read of the
// memtable), with one range deletion beyond maxPointTrim records.
func TestCheckpointTrimsItsRecords(t *testing.T) {
	ctx := t.Context()
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const g = 3
	st, err := s.Claim(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	appendN := func(n int) {
		t.Helper()
		entries := make([]persistence.Entry, n)
		for i := range entries {
			entries[i] = persistence.Entry{Group: g, Epoch: st.Epoch, Data: []byte("r")}
		}
		if _, err := s.Append(ctx, entries); err != nil {
			t.Fatal(err)
		}
	}
	// The group's records left, and the range deletions the memtables hold.
	left := func() (records int, rangeDels int) {
		t.Helper()
		lower, upper := logBounds(g, 1, ^persistence.Position(0))
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			records++
		}
		if err := s.db.ScanInternal(ctx, block.CategoryUnknown, lower, upper,
			func(*pebble.InternalKey, pebble.LazyValue, pebble.IteratorLevel) error { return nil },
			func([]byte, []byte, pebble.SeqNum) error { rangeDels++; return nil },
			nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		return records, rangeDels
	}

	appendN(100)
	if err := s.Checkpoint(ctx, g, st.Epoch, persistence.CheckpointData{Through: 60}); err != nil {
		t.Fatal(err)
	}
	if n, dels := left(); n != 40 || dels != 0 {
		t.Errorf("after a checkpoint through 60 of 100 records: %d records left (want 40), %d range deletions (want 0)", n, dels)
	}

	appendN(maxPointTrim + 10) // positions 101 … maxPointTrim+110
	through := persistence.Position(maxPointTrim + 105)
	if err := s.Checkpoint(ctx, g, st.Epoch, persistence.CheckpointData{Through: through}); err != nil {
		t.Fatal(err)
	}
	if n, dels := left(); n != 5 || dels != 1 {
		t.Errorf("after a checkpoint over %d records: %d records left (want 5), %d range deletions (want 1)", through-60, n, dels)
	}
	if err := s.Read(ctx, g, through, func(p persistence.Position, _ []byte) error {
		if p <= through {
			t.Errorf("read record %d at or below the checkpoint %d", p, through)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
