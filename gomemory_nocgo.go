//go:build !cgo

package keyfold

// cgoEnabled: without cgo, Pebble's block cache and memtables are Go
// allocations, which the Go runtime's memory limit counts.
const cgoEnabled = false
