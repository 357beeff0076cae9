package actors_test

import (
	"context"
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

// TestPacedCheckpointRound: a round of the checkpoint loop is paced by the
// time since the last one began (here an hour: half an hour for its
// thousand keys). A shutdown during it still checkpoints every key (the
// final checkpoint is not paced) and a restart replays nothing; a round
// during which CheckpointMaxBytes were logged ends soon after; and a
// round hurried (as a memory budget full of changed keys does) ends at
// once.
func TestPacedCheckpointRound(t *testing.T) {
	const keys = 1200 // over minPacedKeys
	cfg := actors.Config{Groups: 4, CheckpointInterval: time.Hour, CheckpointRecords: 1 << 30,
		CheckpointBytes: 4 << 10, CheckpointMaxBytes: 4 << 10}
	lastHourAgo := func(h *actors.Host) { actors.SetLastRound(h, time.Now().Add(-time.Hour)) }
	load := func(hs *harness) {
		batch := make([][]byte, 0, keys)
		for i := range keys {
			batch = append(batch, event(fmt.Sprintf("k%d", i), fmt.Sprint(i), 1))
		}
		hs.ingest(batch...) // a checkpoint due: past both bounds
		eventually(t, "a paced round", func() bool { return actors.Paced(hs.host) })
	}

	t.Run("shutdown", func(t *testing.T) {
		dir := t.TempDir()
		store := openStore(t, dir)
		hs := start(t, store, cfg, lastHourAgo)
		load(hs)
		begin := time.Now()
		if err := hs.shutdown(); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took > 20*time.Second {
			t.Errorf("shutdown took %v: the final checkpoint waited for the round's pace", took)
		}
		hs2 := start(t, store, cfg)
		defer hs2.shutdown()
		if st := hs2.host.Stats(); st.Replayed != 0 {
			t.Errorf("the restart replayed %d records: the final checkpoint missed keys", st.Replayed)
		}
		if v := hs2.query(fmt.Sprintf("k%d", keys-1)); v.Seq != 1 {
			t.Errorf("the last key after the restart: %+v, want one event", v)
		}
	})
	t.Run("logged past the bound", func(t *testing.T) {
		// CheckpointMaxBytes logged during the round hurries it: the
		// replay bound holds whatever the pace.
		hs := start(t, openStore(t, t.TempDir()), cfg, lastHourAgo)
		defer hs.shutdown()
		load(hs)
		for i := 0; actors.Paced(hs.host) || hs.host.Stats().Checkpoints == 0; i++ {
			if i == 1000 { // ≈ 60 KiB of log, fifteen times the bound
				t.Fatalf("the round is still paced after %d more events", i)
			}
			hs.ingest(event(fmt.Sprintf("k%d", i), fmt.Sprintf("more%d", i), 1))
		}
	})
	t.Run("released", func(t *testing.T) {
		// A release checkpoints its groups, which the round holds: it
		// hurries the round rather than wait for its pace.
		hs := start(t, openStore(t, t.TempDir()), cfg, lastHourAgo)
		defer hs.shutdown()
		load(hs)
		done := make(chan error, 1)
		go func() { done <- hs.host.SetOwned(context.Background(), []uint32{}) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("releasing the groups waited for the round's pace")
		}
	})
	t.Run("hurried", func(t *testing.T) {
		hs := start(t, openStore(t, t.TempDir()), cfg, lastHourAgo)
		defer hs.shutdown()
		load(hs)
		if st := hs.host.Stats(); st.DirtyKeys < keys/2 {
			t.Fatalf("%d changed keys left a moment into a round paced over half an hour", st.DirtyKeys)
		}
		actors.HurryCheckpoint(hs.host)
		eventually(t, "the hurried round to end", func() bool { return !actors.Paced(hs.host) && hs.host.Stats().DirtyKeys == 0 })
	})
}
