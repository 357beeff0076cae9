// Package faultstore wraps a persistence.Store to inject faults, like
// Pebble's errorfs: a test arranges for the Nth call of an operation to fail
// with a given error, to be delayed, or to reach the store and then fail (a
// lost acknowledgement).
//
//	s := faultstore.New(inner)
//	s.FailNext(faultstore.OpAppend, errDisk)
//	_, err := s.Append(ctx, entries) // err == errDisk; nothing appended
//
// The wrapper is safe for concurrent use; concurrent calls of one operation
// are numbered in the order they arrive.
package faultstore
