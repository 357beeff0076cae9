//go:build linux

package embedded

import (
	"bytes"
	"os"
	"testing"

	"github.com/keyfold/keyfold/persistence"
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
