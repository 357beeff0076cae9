package faultstore

import (
	"fmt"
	"time"
)

// Op names a store operation.
type Op int

// The operations of persistence.Store.
const (
	OpClaim Op = iota
	OpAppend
	OpRead
	OpCheckpoint
	OpGet
	OpCheckGroups
	OpClose
	OpTimers
	OpReadOutputs
	OpTrimOutputs
	OpAppendOutputs
	OpLookupIDs
	numOps
)

var opNames = [numOps]string{"Claim", "Append", "Read", "Checkpoint", "Get", "CheckGroups", "Close", "Timers", "ReadOutputs", "TrimOutputs", "AppendOutputs", "LookupIDs"}

func (o Op) String() string {
	if o < 0 || o >= numOps {
		return fmt.Sprintf("Op(%d)", int(o))
	}
	return opNames[o]
}

// Fault is what happens to one call. The zero Fault does nothing.
type Fault struct {
	// Delay is waited before the call. If the call's context ends first,
	// the call fails with the context's error and does not reach the store.
	Delay time.Duration

	// Wait, if non-nil, is waited for (until it is closed) after Delay, so
	// that a test can hold a call in flight while it does something else.
	// If the call's context ends first, the call fails as for Delay.
	Wait <-chan struct{}

	// Err, if non-nil, is the error the call returns, as it is.
	Err error

	// After makes the call reach the store before it returns Err: the store
	// changes, but the caller sees a failure, as when a reply is lost. An
	// Append that fails this way returns positions of 0.
	After bool
}
