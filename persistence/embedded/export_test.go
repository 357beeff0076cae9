package embedded

import "github.com/cockroachdb/pebble/v2/vfs"

// OpenFS opens a store on a filesystem of the test's (fault injection).
func OpenFS(dir string, opts Options, fs vfs.FS) (*Store, error) {
	opts.fs = fs
	return Open(dir, opts)
}

// FlushIDIndex flushes the id index's memtable into a level 0 table.
func FlushIDIndex(s *Store) error { return s.ids.db.Flush() }

// IDIndexTables returns the number of the id index's tables.
func IDIndexTables(s *Store) int {
	return int(s.ids.db.Metrics().Total().TablesCount)
}
