package actors_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// TestLoggedBytesBoundAndReplayed: under a steady load over every group,
// the log above the checkpoints (Stats.LoggedBytes, what a restart
// replays) stays near CheckpointMaxBytes (the load spreads over more keys
// than a checkpoint at CheckpointBytes would find sent to twice), and a
// restart after a crash replays exactly what the host reported.
func TestLoggedBytesBoundAndReplayed(t *testing.T) {
	const groups, bound = 32, 16 << 10
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	hs := start(t, fs, actors.Config{Groups: groups, CheckpointInterval: time.Hour, CheckpointRecords: 1 << 30,
		CheckpointBytes: bound / 4, CheckpointMaxBytes: bound})
	var most int64
	for i := range 400 { // ≈ 60 bytes of log per event: ≈ 15 times the bound
		batch := make([][]byte, 10)
		for j := range batch {
			n := i*len(batch) + j
			batch[j] = event(fmt.Sprintf("k%d", n%500), fmt.Sprint(n), 1)
		}
		hs.ingest(batch...)
		most = max(most, hs.host.Stats().LoggedBytes)
	}
	if st := hs.host.Stats(); st.Checkpoints == 0 {
		t.Fatalf("no checkpoint after %d KiB of log", 400*10*60>>10)
	}
	// A checkpoint starts at the bound and takes a moment, meanwhile the
	// load goes on: twice the bound is far below the 15 times of none.
	if most > 2*bound {
		t.Errorf("the log above the checkpoints reached %d bytes, bound %d", most, bound)
	}

	// A crash now (no checkpoint can be written at the end) leaves
	// LoggedBytes of log to replay, and the restarted host counts the same.
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
	hs.ingest(event("k7", "last", 1)) // something above the last checkpoint
	if err := hs.shutdown(); err == nil {
		t.Fatal("shutdown with a failing checkpoint reported no error")
	}
	left := hs.host.Stats().LoggedBytes
	if left == 0 || left > 2*bound {
		t.Errorf("%d bytes above the checkpoints after the load, want (0, %d]", left, 2*bound)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	hs2 := start(t, openStore(t, dir), actors.Config{Groups: groups, CheckpointInterval: time.Hour})
	defer hs2.shutdown()
	if got := hs2.host.Stats().LoggedBytes; got != left {
		t.Errorf("the restart replayed %d bytes of log, the host had %d above its checkpoints", got, left)
	}
	if v := hs2.query("k7"); v.Seq != 9 {
		t.Errorf("k7 after the restart: %+v, want seq 9", v)
	}
}
