package actors_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
)

// lockedBuffer is a log destination safe for the host's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCheckpointIntervalCountsFromLastRound: CheckpointInterval bounds the
// time between checkpoints of a quiet node; under a load that begins rounds
// more often (CheckpointBytes), it adds none of its own.
func TestCheckpointIntervalCountsFromLastRound(t *testing.T) {
	const interval = 500 * time.Millisecond
	var logs lockedBuffer
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Groups: 4, CheckpointInterval: interval,
		CheckpointRecords: 1 << 30, CheckpointBytes: 2 << 10,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	defer hs.shutdown()
	// Four intervals of load: 20 keys, so that the rounds' two deliveries
	// a key come within a few batches.
	for i, end := 0, time.Now().Add(4*interval); time.Now().Before(end); i++ {
		hs.ingest(event(fmt.Sprintf("k%d", i%20), fmt.Sprint(i), 1))
	}
	out := logs.String()
	byBytes, byInterval := strings.Count(out, "why=checkpoint_bytes"), strings.Count(out, "why=checkpoint_interval")
	if byBytes < 8 || byInterval > 0 {
		t.Fatalf("under load: %d rounds begun by checkpoint_bytes, %d by checkpoint_interval; want at least 8 and none", byBytes, byInterval)
	}
	// Quiet: the interval begins them.
	eventually(t, "a round begun by checkpoint_interval on a quiet node", func() bool {
		return strings.Contains(logs.String(), "why=checkpoint_interval")
	})
}
