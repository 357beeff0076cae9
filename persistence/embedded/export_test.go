package embedded

import "github.com/cockroachdb/pebble/v2/vfs"

// OpenFS opens a store on a filesystem of the test's (fault injection).
func OpenFS(dir string, opts Options, fs vfs.FS) (*Store, error) {
	opts.fs = fs
	return Open(dir, opts)
}
