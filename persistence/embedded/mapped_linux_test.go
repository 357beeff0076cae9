//go:build linux

package embedded

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/keyfold/keyfold/persistence"
	"golang.org/x/sys/unix"
)

// A store's tables are mapped once Pebble reads them: /proc/self/maps
// lists them. (Linux only: other systems have no /proc/self/maps; the
// mapping itself is tested in mapped_test.go.)
func TestStoreMapsItsTables(t *testing.T) {
	dir := t.TempDir()
	for _, pread := range []bool{false, true} {
		s, err := Open(dir, Options{PreadTables: pread})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		st, err := s.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 1, Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("v")}}}); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Get(ctx, 1, "k"); err != nil || string(v) != "v" {
			t.Fatalf("Get = %q, %v", v, err)
		}
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		if mapped := bytes.Contains(maps, []byte(dir)) && bytes.Contains(maps, []byte(".sst")); mapped == pread {
			t.Errorf("PreadTables %v: tables mapped %v\n%s", pread, mapped, maps)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if maps, _ = os.ReadFile("/proc/self/maps"); bytes.Contains(maps, []byte(dir)) {
			t.Fatalf("a closed store's tables are still mapped:\n%s", maps)
		}
	}
}

// A table the kernel refuses to map (here ENOMEM, as at vm.max_map_count)
// is read by pread: the reads still return what the store holds, the
// store counts the table (DiskStats.UnmappedTables), and the log has one
// warning naming the cause, not one per table.
func TestUnmappedTablesCountedAndWarned(t *testing.T) {
	var refusals atomic.Int64 // (Pebble may open tables on goroutines of its own)
	defer func(m func(int, int64, int, int, int) ([]byte, error)) { mmap = m }(mmap)
	mmap = func(int, int64, int, int, int) ([]byte, error) {
		refusals.Add(1)
		return nil, unix.ENOMEM
	}
	var logs bytes.Buffer
	s, err := Open(t.TempDir(), Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"k1", "k2"} {
		if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		through := persistence.Position(i + 1)
		if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: through, Snapshots: []persistence.Snapshot{{Key: key, Data: []byte("v" + key)}}}); err != nil {
			t.Fatal(err)
		}
		if err := s.db.Flush(); err != nil { // (a table of its own)
			t.Fatal(err)
		}
		if v, err := s.Get(ctx, 1, key); err != nil || string(v) != "v"+key {
			t.Fatalf("Get(%s) = %q, %v", key, v, err)
		}
	}
	// (Counted after the refusal: read in this order, the count is at
	// most the refusals.)
	if got, refused := s.Disk().UnmappedTables, refusals.Load(); got < 2 || got > refused {
		t.Errorf("DiskStats.UnmappedTables = %d, want the refused openings, %d, and 2 or more", got, refused)
	}
	if n := strings.Count(logs.String(), "could not be mapped"); n != 1 || !strings.Contains(logs.String(), "vm.max_map_count") || !strings.Contains(logs.String(), ".sst") {
		t.Errorf("%d warnings of refused mappings (want 1, naming vm.max_map_count):\n%s", n, logs.String())
	}
}
