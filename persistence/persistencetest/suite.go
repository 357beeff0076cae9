package persistencetest

import (
	"testing"

	"github.com/keyfold/keyfold/persistence"
)

// Harness opens stores for the suite.
type Harness struct {
	// New returns a new, empty store; the suite closes it.
	New func(t *testing.T) persistence.Store
	// Reopen closes s and opens the same data again. Required: every
	// keyfold store is durable.
	Reopen func(t *testing.T, s persistence.Store) persistence.Store
}

// test is one conformance test.
type test struct {
	name string
	run  func(e *env)
}

// tests lists the whole suite, in the order Run runs it.
var tests = []test{
	{name: "AppendRead", run: testAppendRead},
	{name: "AppendEmpty", run: testAppendEmpty},
	{name: "AppendCopiesData", run: testAppendCopiesData},
	{name: "LargeRecord", run: testLargeRecord},
	{name: "ReadAfter", run: testReadAfter},
	{name: "ReadFnError", run: testReadFnError},
	{name: "Claim", run: testClaim},
	{name: "AppendFenced", run: testAppendFenced},
	{name: "AppendUnclaimed", run: testAppendUnclaimed},
	{name: "TrimFenced", run: testTrimFenced},
	{name: "Trim", run: testTrim},
	{name: "TrimBelowCheckpoint", run: testTrimBelowCheckpoint},
	{name: "TrimReopen", run: testTrimReopen},
	{name: "CheckpointAtomic", run: testCheckpointAtomic},
	{name: "Snapshots", run: testSnapshots},
	{name: "SnapshotsCopyData", run: testSnapshotsCopyData},
	{name: "GetMany", run: testGetMany},
	{name: "SnapshotsIsolatedByGroup", run: testSnapshotsIsolatedByGroup},
	{name: "PutFenced", run: testPutFenced},
	{name: "CheckGroups", run: testCheckGroups},
	{name: "CheckGroupsReopen", run: testCheckGroupsReopen},
	{name: "Durability", run: testDurability},
	{name: "Closed", run: testClosed},
	{name: "CancelledContext", run: testCancelledContext},
	{name: "ConcurrentAppendGroups", run: testConcurrentAppendGroups},
	{name: "ConcurrentAppendOneGroup", run: testConcurrentAppendOneGroup},
	{name: "ClaimFencesRacingWrites", run: testClaimFencesRacingWrites},
	{name: "ConcurrentTrimsReopen", run: testConcurrentTrimsReopen},
}

// Run runs the conformance suite against the stores h opens, one subtest per
// property, each on a new store.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("persistencetest: Harness.New is nil")
	}
	if h.Reopen == nil {
		// Every keyfold store is durable (an ack means the data survives a
		// restart), so the durability tests always run.
		t.Fatal("persistencetest: Harness.Reopen is nil: every store must be able to reopen its data")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(newEnv(t, h))
		})
	}
}
