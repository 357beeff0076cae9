package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/faultstore"
)

// roundLog collects the sizes of the host's checkpoint rounds from its
// debug log.
type roundLog struct {
	mu     sync.Mutex
	groups []int64
}

func (r *roundLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *roundLog) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *roundLog) WithGroup(string) slog.Handler            { return r }
func (r *roundLog) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "checkpoint round" {
		return nil
	}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "groups" {
			r.mu.Lock()
			r.groups = append(r.groups, a.Value.Int64())
			r.mu.Unlock()
		}
		return true
	})
	return nil
}

// TestCheckpointsArePaced: under a steady load over every group, a
// checkpoint round writes a few groups, those with the longest logs, not
// all of them at once; the log above the checkpoints (what a restart
// replays) stays near CheckpointBytes, and a restart replays exactly that.
func TestCheckpointsArePaced(t *testing.T) {
	const groups, bound = 32, 16 << 10
	dir := t.TempDir()
	fs := faultstore.New(openStore(t, dir))
	rounds := &roundLog{}
	hs := start(t, fs, actors.Config{Groups: groups, CheckpointInterval: time.Hour, CheckpointRecords: 1 << 30,
		CheckpointBytes: bound, Logger: slog.New(rounds)})
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
	// The last round may still run: its groups are counted once it ends.
	var sizes []int64
	var total int64
	eventually(t, "the rounds logged to add up to the group checkpoints", func() bool {
		rounds.mu.Lock()
		sizes = append([]int64(nil), rounds.groups...)
		rounds.mu.Unlock()
		total = 0
		for _, n := range sizes {
			total += n
		}
		return total == hs.host.Stats().Checkpoints
	})
	st := hs.host.Stats()
	if st.Checkpoints == 0 {
		t.Fatalf("no checkpoint after %d KiB of log", 400*10*60>>10)
	}
	// A round starts at the bound and takes a moment, meanwhile the load
	// goes on: twice the bound is far below the 15 times of no checkpoint.
	if most > 2*bound {
		t.Errorf("the log above the checkpoints reached %d bytes, bound %d", most, bound)
	}
	var biggest int64
	for _, n := range sizes {
		biggest = max(biggest, n)
	}
	// Steady state: a round takes about a quarter of the bound from the
	// longest logs, each about twice the average (≈ groups/7 of them).
	if len(sizes) < 5 || biggest > groups/2 {
		t.Errorf("%d checkpoint rounds of %v groups: want several, none of more than half of the %d groups", len(sizes), sizes, groups)
	}

	// A crash now (no checkpoint can be written at the end) leaves
	// LoggedBytes of log to replay, and the restarted host counts the same.
	fs.InjectAll(faultstore.OpCheckpoint, faultstore.Fault{Err: errors.New("injected")})
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
	if v := hs2.query("k7"); v.Seq != 8 {
		t.Errorf("k7 after the restart: %+v, want seq 8", v)
	}
}
