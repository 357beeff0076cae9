//go:build cgo

package keyfold

// cgoEnabled: Pebble allocates its block cache and memtables with C's
// malloc (its manual allocator), outside the Go runtime's memory limit.
const cgoEnabled = true
