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
	// OutputsAtLeastOnce says that the store may append the outputs of a
	// checkpoint that fails (the Redis store appends them before its
	// fenced script runs), as persistence.Store.Checkpoint allows. The
	// suite then skips the tests that a failed checkpoint appends none.
	OutputsAtLeastOnce bool
	// NoIDIndex says that the store has no id index (a Redis store of a
	// format before 3 refuses ids): the suite then checks that a
	// checkpoint with ids fails and writes nothing, instead of the index.
	NoIDIndex bool
}

// test is one conformance test.
type test struct {
	name string
	run  func(e *env)
	// ids: the test needs an id index; noIDs: it checks a store without.
	ids, noIDs bool
}

// tests lists the whole suite, in the order Run runs it.
var tests = []test{
	{name: "AppendRead", run: testAppendRead},
	{name: "AppendEmpty", run: testAppendEmpty},
	{name: "AppendCopiesData", run: testAppendCopiesData},
	{name: "LargeRecord", run: testLargeRecord},
	{name: "RecordsOneACall", run: testRecordsOneACall},
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
	{name: "ManySnapshotsInOneCheckpoint", run: testManySnapshots},
	{name: "GetMany", run: testGetMany},
	{name: "GetGroups", run: testGetGroups},
	{name: "SnapshotsIsolatedByGroup", run: testSnapshotsIsolatedByGroup},
	{name: "PutFenced", run: testPutFenced},
	{name: "TimersIndex", run: testTimersIndex},
	{name: "TimersFenced", run: testTimersFenced},
	{name: "TimersFnError", run: testTimersFnError},
	{name: "IDIndex", run: testIDIndex, ids: true},
	{name: "IDsDropBefore", run: testIDsDropBefore, ids: true},
	{name: "IDsDropSparse", run: testIDsDropSparse, ids: true},
	{name: "IDsAtomic", run: testIDsAtomic, ids: true},
	{name: "NoIDIndex", run: testNoIDIndex, noIDs: true},
	{name: "Outputs", run: testOutputs},
	{name: "OutputsCopyData", run: testOutputsCopyData},
	{name: "OutputsReopen", run: testOutputsReopen},
	{name: "OutputsBadCursor", run: testOutputsBadCursor},
	{name: "OutputsBadLimit", run: testOutputsBadLimit},
	{name: "AppendOutputs", run: testAppendOutputs},
	{name: "OutputsCursorPastEnd", run: testOutputsCursorPastEnd},
	{name: "OutputsTrim", run: testOutputsTrim},
	{name: "OutputsTrimAllReopen", run: testOutputsTrimAllReopen},
	{name: "OutputsAtomic", run: testOutputsAtomic},
	{name: "CheckGroups", run: testCheckGroups},
	{name: "CheckGroupsReopen", run: testCheckGroupsReopen},
	{name: "Durability", run: testDurability},
	{name: "Closed", run: testClosed},
	{name: "CancelledContext", run: testCancelledContext},
	{name: "ConcurrentAppendGroups", run: testConcurrentAppendGroups},
	{name: "ConcurrentAppendOneGroup", run: testConcurrentAppendOneGroup},
	{name: "ClaimFencesRacingWrites", run: testClaimFencesRacingWrites},
	{name: "ConcurrentTrimsReopen", run: testConcurrentTrimsReopen},
	{name: "ConcurrentOutputs", run: testConcurrentOutputs},
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
		if tc.ids && h.NoIDIndex || tc.noIDs && !h.NoIDIndex {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			tc.run(newEnv(t, h))
		})
	}
}
