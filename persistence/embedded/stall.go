package embedded

import (
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// stallState follows Pebble's write stalls (writes held back while flushes
// or compactions fall behind): every append, so every ack, waits with
// them, and a stall is what an operator seeing slow acks looks for first.
type stallState struct {
	mu     sync.Mutex
	since  time.Time
	reason string
}

func (s *Store) stallBegin(info pebble.WriteStallBeginInfo) {
	s.stall.mu.Lock()
	defer s.stall.mu.Unlock()
	s.stall.since, s.stall.reason = time.Now(), info.Reason
}

// stallEnd logs the stall that ended: a warning from a second on.
func (s *Store) stallEnd() {
	s.stall.mu.Lock()
	took, reason := time.Since(s.stall.since), s.stall.reason
	s.stall.mu.Unlock()
	log := s.log.Debug
	if took >= time.Second {
		log = s.log.Warn
	}
	log("store: writes stalled while Pebble's flushes or compactions caught up", "dir", s.dir, "reason", reason, "took", took)
}
