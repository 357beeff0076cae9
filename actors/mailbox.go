package actors

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// grainMailbox is the mailbox of a grain's actor: protoactor's default one
// (actor.Unbounded) with the same semantics at a fraction of its memory and
// allocations. The default keeps a lock-free ring of 16 slots for user
// messages and a linked queue for system messages, ~370 B per actor whether
// or not anything waits, and allocates a node per system message; a key
// mostly waits for its next message, and at a million keys the rings alone
// were a fifth of an active key's memory (BENCHMARKS.md). Here both queues
// are slices behind one mutex, released when they drain.
//
// Semantics kept from the default: system messages before user messages;
// SuspendMailbox/ResumeMailbox stop and resume user messages (system ones
// still flow); a run processes at most the dispatcher's throughput of
// messages before it yields its worker (it schedules itself again); a panic
// escaping the invoker is escalated (grains recover their own, so this is
// protoactor's supervision path only); one run at a time.
type grainMailbox struct {
	mu         sync.Mutex
	sys, user  fifo
	scheduled  bool // a run is scheduled or running
	suspended  bool
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
}

func (m *grainMailbox) PostUserMessage(msg any) {
	m.mu.Lock()
	m.user.push(msg)
	m.scheduleLocked()
}

func (m *grainMailbox) PostSystemMessage(msg any) {
	m.mu.Lock()
	m.sys.push(msg)
	m.scheduleLocked()
}

// scheduleLocked schedules a run unless one is pending, and unlocks m.mu
// (before scheduling: a dispatcher may run it at once).
func (m *grainMailbox) scheduleLocked() {
	if m.scheduled {
		m.mu.Unlock()
		return
	}
	m.scheduled = true
	m.mu.Unlock()
	m.dispatcher.Schedule(m.run)
}

// idle reports whether no run is scheduled or running and no message
// waits: then the last message it was sent has been processed, and its
// effects are visible to the caller (both hold m.mu). Whether it stays
// idle is the caller's to ensure: the host posts a key's messages under
// h.mu, and checks this under h.mu (stopLocked, and snapshotKeys, which
// then snapshots the grain itself).
func (m *grainMailbox) idle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.scheduled && !m.suspended && m.user.len() == 0 && m.sys.len() == 0
}

func (m *grainMailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
}

func (m *grainMailbox) Start() {}

func (m *grainMailbox) UserMessageCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.user.len()
}

// run processes messages until none is left (or user messages are
// suspended), or until it has processed the dispatcher's throughput, when it
// schedules itself again to let other mailboxes run.
func (m *grainMailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
			// The failure suspended the mailbox (a system message already
			// queued); go on with the system messages in a new run.
			m.mu.Lock()
			m.scheduled = false
			m.scheduleLocked()
		}
	}()
	for range m.dispatcher.Throughput() {
		m.mu.Lock()
		var sys bool
		switch {
		case m.sys.len() > 0:
			msg, sys = m.sys.pop(), true
		case !m.suspended && m.user.len() > 0:
			msg = m.user.pop()
		default:
			m.scheduled = false
			m.mu.Unlock()
			return
		}
		if sys {
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended = true
				m.mu.Unlock()
				continue
			case *actor.ResumeMailbox:
				m.suspended = false
				m.mu.Unlock()
				continue
			}
		}
		m.mu.Unlock()
		if sys {
			m.invoker.InvokeSystemMessage(msg)
		} else {
			m.invoker.InvokeUserMessage(msg)
		}
	}
	msg = nil
	m.dispatcher.Schedule(m.run) // still scheduled: yield, then go on
}

// fifo is a queue of messages in a slice. One message waits in the queue
// itself (a key's usual case: no allocation); a longer queue's slice is
// dropped once it drains, so an idle key holds nothing for it.
type fifo struct {
	items []any
	head  int
	one   [1]any
}

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) push(v any) {
	if q.head > 0 && len(q.items) == cap(q.items) {
		// Full with popped slots at the front: reuse them.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	if q.items == nil {
		q.items = q.one[:0]
	}
	q.items = append(q.items, v)
}

func (q *fifo) pop() any {
	v := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.one[:0], 0 // drained: nothing kept for an idle key
	}
	return v
}
