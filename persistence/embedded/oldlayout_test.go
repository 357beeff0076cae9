package embedded

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestOldStoreLayout: a store created before the key-group layout was
// recorded (no mlayout key) reads as layout 0, and opening it with a build
// that records layouts does not give it one.
func TestOldStoreLayout(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.CheckGroups(t.Context(), 16, 2); err != nil || l != 2 {
		t.Fatalf("new store: layout %d, %v; want 2", l, err)
	}
	if err := s.db.Delete(metaLayoutKey, pebble.Sync); err != nil { // as an older build left it
		t.Fatal(err)
	}
	for range 2 {
		if l, err := s.CheckGroups(t.Context(), 16, 2); err != nil || l != 0 {
			t.Fatalf("old store: layout %d, %v; want 0", l, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
