package actors_test

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// A key whose remembered ids are in buckets comes back into memory from
// an embedded store with one read, its snapshot and its buckets' parts
// together (persistence.PartsReader), and remembers every id; from a store
// created before that (Pebble's default comparer), with a read for the
// snapshot and one for the parts, remembering the same.
func TestKeyAndItsPartsInOneRead(t *testing.T) {
	for _, c := range []struct {
		name  string
		old   bool
		reads int
	}{{"new store", false, 1}, {"store created before", true, 2}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.old {
				db, err := pebble.Open(dir, &pebble.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
			}
			store := openStore(t, dir)
			hs := start(t, store, actors.Config{Groups: 4})
			const keys, ids = 6, 3*fold.PartIDs + 5 // parts 0-3 of a bucket
			for i := range keys {
				for j := range ids {
					hs.ingest(event(fmt.Sprintf("k%d", i), fmt.Sprintf("z%d", j), 1))
				}
			}
			if err := hs.shutdown(); err != nil {
				t.Fatal(err)
			}
			fs := faultstore.New(store)
			again := start(t, fs, actors.Config{Groups: 4, CacheMemory: -1})
			defer again.shutdown()
			for i := range keys {
				k := fmt.Sprintf("k%d", i)
				before := fs.Calls(faultstore.OpGet)
				// An id of the first part, one of the last, and a new one.
				if r := again.ingest(event(k, "z0", 1000), event(k, fmt.Sprintf("z%d", ids-1), 1000), event(k, "new", 1)); r.Duplicates != 2 {
					t.Fatalf("%s after a restart: %+v, want 2 duplicates", k, r)
				}
				if n := fs.Calls(faultstore.OpGet) - before; n != c.reads {
					t.Errorf("%s came back into memory with %d store reads, want %d", k, n, c.reads)
				}
				if v := again.query(k); v.Seq != ids+1 || v.Aggregates["sum"] != float64(ids+1) {
					t.Fatalf("%s = %+v, want seq and sum %d", k, v, ids+1)
				}
			}
		})
	}
}
