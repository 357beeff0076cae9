// Package persistencetest is the conformance suite every persistence.Store
// runs, in the spirit of watermill's pubsub/tests: a store's test file builds
// a [Harness] and calls [Run].
//
//	func TestStore(t *testing.T) {
//		persistencetest.Run(t, persistencetest.Harness{
//			New: func(t *testing.T) persistence.Store { … },
//			Reopen: func(t *testing.T, s persistence.Store) persistence.Store { … },
//		})
//	}
//
// The suite checks the contract documented on the persistence interfaces:
// positions, fencing, trimming, snapshots, the timer index, output logs and
// their cursors, the key group count, durability across a reopen, closing,
// cancelled contexts, concurrent appends and concurrent checkpoints with
// outputs.
// Subtests run one after the other; each gets its own store from
// [Harness.New].
package persistencetest
