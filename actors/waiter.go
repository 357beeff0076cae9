package actors

import (
	"sync"
	"sync/atomic"

	"github.com/keyfold/keyfold/actors/fold"
)

// waiter collects the outcome of one ingest call across the keys it touched.
// Each key's grain (or the commit loop, for a failed append) finishes one
// segment; the call returns when every segment is finished.
type waiter struct {
	pending atomic.Int64
	dups    atomic.Int64
	done    chan struct{}

	mu    sync.Mutex
	err   error
	reply *fold.Reply // a call's (call.go)
}

func newWaiter() *waiter { return &waiter{done: make(chan struct{})} }

// finish records one segment's outcome. A nil waiter (replay) ignores it.
func (w *waiter) finish(dups int, err error) {
	if w == nil {
		return
	}
	if err != nil {
		w.mu.Lock()
		if w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	}
	w.dups.Add(int64(dups))
	if w.pending.Add(-1) == 0 {
		close(w.done)
	}
}

func (w *waiter) result() (dups int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.dups.Load()), w.err
}

// answer records a call's reply, before its segment finishes. A nil waiter
// (replay) ignores it.
func (w *waiter) answer(r fold.Reply) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.reply = &r
	w.mu.Unlock()
}

// answered returns the call's reply, nil if none was recorded (the call was
// logged but is applied by a replay).
func (w *waiter) answered() *fold.Reply {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reply
}
