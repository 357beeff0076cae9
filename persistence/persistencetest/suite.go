package persistencetest

import (
	"testing"

	"github.com/keyfold/keyfold/persistence"
)

// Harness opens stores for the suite.
type Harness struct {
	// New returns a new, empty store; the suite closes it.
	New func(t *testing.T) persistence.Store
	// Reopen closes s and opens the same data again (nil if the store has no
	// durable data; the suite then skips the durability tests).
	Reopen func(t *testing.T, s persistence.Store) persistence.Store
}

// test is one conformance test. A durable test needs Harness.Reopen.
type test struct {
	name    string
	durable bool
	run     func(e *env)
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
	{name: "TrimReopen", durable: true, run: testTrimReopen},
	{name: "Snapshots", run: testSnapshots},
	{name: "SnapshotsCopyData", run: testSnapshotsCopyData},
	{name: "SnapshotsIsolatedByGroup", run: testSnapshotsIsolatedByGroup},
	{name: "PutFenced", run: testPutFenced},
	{name: "CheckGroups", run: testCheckGroups},
	{name: "CheckGroupsReopen", durable: true, run: testCheckGroupsReopen},
	{name: "Durability", durable: true, run: testDurability},
	{name: "Closed", run: testClosed},
	{name: "CancelledContext", run: testCancelledContext},
	{name: "ConcurrentAppendGroups", run: testConcurrentAppendGroups},
	{name: "ConcurrentAppendOneGroup", run: testConcurrentAppendOneGroup},
	{name: "ClaimFencesRacingWrites", run: testClaimFencesRacingWrites},
	{name: "ConcurrentTrimsReopen", durable: true, run: testConcurrentTrimsReopen},
}

// Run runs the conformance suite against the stores h opens, one subtest per
// property, each on a new store.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("persistencetest: Harness.New is nil")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.durable && h.Reopen == nil {
				t.Skip("the store has no durable data (Harness.Reopen is nil)")
			}
			tc.run(newEnv(t, h))
		})
	}
}
