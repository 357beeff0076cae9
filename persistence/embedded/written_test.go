package embedded

import (
	"fmt"
	"testing"

	"github.com/keyfold/keyfold/persistence"
)

// The tables flushes and compactions write are counted (the metrics
// keyfold_store_flushed_bytes_total and keyfold_store_compacted_bytes_total),
// and a compaction's are not taken for a flush's.
func TestWrittenBytesCounted(t *testing.T) {
	ctx := t.Context()
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	epoch := claim(t, s, 0)[0]
	if d := s.Disk(); d.FlushedBytes != 0 || d.CompactedBytes != 0 {
		t.Fatalf("a new store: flushed %d, compacted %d bytes, want 0", d.FlushedBytes, d.CompactedBytes)
	}
	write := func(round int) {
		var d persistence.CheckpointData
		for k := range 2000 {
			d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: fmt.Sprintf("key-%d", k), Data: fmt.Appendf(nil, "state %d of key %d", round, k)})
		}
		if err := s.Checkpoint(ctx, 0, epoch, d); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	write(1)
	flushed := s.Disk().FlushedBytes
	if flushed < 2000*10 {
		t.Fatalf("after a flush of 2000 snapshots: flushed %d bytes", flushed)
	}
	write(2)
	if d := s.Disk(); d.FlushedBytes <= flushed {
		t.Fatalf("after a second flush: flushed %d bytes, was %d", d.FlushedBytes, flushed)
	}
	flushed = s.Disk().FlushedBytes
	if err := s.db.Compact(ctx, []byte{kindSnapshot}, []byte{kindSnapshot + 1}, true); err != nil {
		t.Fatal(err)
	}
	d := s.Disk()
	if d.CompactedBytes <= 0 || d.FlushedBytes != flushed {
		t.Fatalf("after a compaction: compacted %d bytes, flushed %d (was %d)", d.CompactedBytes, d.FlushedBytes, flushed)
	}
}
