package actors

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
)

// Shells: the actors that run the keys.
//
// A key in use has an actor of its own (a protoactor-go actor: a mailbox
// and a run at a time on the dispatcher's workers), and only that actor
// changes the key's grain: it applies the key's inputs one message at a
// time, in the order they were sent. (A checkpoint snapshots the grain of
// an idle actor itself, under h.mu: checkpoint.go.) The actor is not tied
// to the key for life, though. When a key passivates, its actor processes the messages
// sent before the passivation, parks the grain (resident.go) and goes back
// to a pool; the next key to activate takes it from there. So an actor
// (a shell) runs one key at a time, and an activation costs a message
// instead of a spawn and a stop: at a million keys most events activate a
// key, and protoactor's spawn and stop (its process registry, a context and
// a mailbox per actor, the stop protocol) took a sixth of the CPU
// (BENCHMARKS.md, session 14).
//
// Handing a shell over is ordered by its mailbox: a shell joins the pool
// under h.mu while processing its key's passivateMsg, the last message sent
// to it for that key (in the same hold of h.mu that sent it, the key
// stopped being active and forgot the shell's PID, so nothing of the key
// reaches the shell after it); or, if its mailbox is idle when the key
// passivates, at once, in that hold of h.mu (stopLocked). Whoever takes
// it from the pool sets its grain under h.mu and then sends it the key's
// message, so the shell sees its new grain with the first message for it,
// and never a message of one key while running another. The first message
// a shell processes for a grain loads the key's state (grain.activate),
// unless the grain was parked with it.

// shell is an actor that runs one key's grain at a time.
type shell struct {
	h   *Host
	pid *actor.PID
	// g is the grain it runs: set by the host under h.mu while the shell is
	// idle in the pool (or being spawned), read by the shell's actor; nil
	// while in the pool.
	g *grain
	// mb is its mailbox. The host posts a key's messages there directly
	// (send): what protoactor's Send does for a local actor without
	// middleware, without the three objects it goes through to find the
	// mailbox (the PID, its cached process, the process), a cache miss
	// each when the keys outnumber the caches (PID.ref was 6% of the node's
	// CPU at a million keys, BENCHMARKS.md session 16). It is part of the
	// shell, not an object of its own: a send reads the shell, then the
	// mailbox, one cache miss less at each (BENCHMARKS.md, session 34).
	mb grainMailbox
}

// passivateMsg parks a shell's grain (parkLocked) once the messages sent
// before it are processed, and returns the shell to the pool.
type passivateMsg struct{}

// maxPooledShells bounds the idle shells kept for the next activations
// (about 500 B each); beyond it a passivated key's shell is stopped. A
// passivation round stops about as many keys as the commits since the last
// one activated.
const maxPooledShells = 8192

func (s *shell) Receive(c actor.Context) {
	g := s.g
	if g == nil {
		return // idle: protoactor's lifecycle messages only
	}
	defer func() {
		if r := recover(); r != nil {
			g.panicked(r)
		}
	}()
	g.activate() // the grain's first message loads its state (a no-op after)
	switch m := c.Message().(type) {
	case *passivateMsg:
		s.passivate(g)
	default:
		g.handle(m) // (ignores protoactor's lifecycle messages)
	}
}

// passivate parks the shell's grain and releases the shell. (h.mu is
// released by a deferred call: a panic in parkLocked, recovered by Receive,
// must not leave it held.)
func (s *shell) passivate(g *grain) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handBackLocked(s, g)
}

// handBackLocked parks g, which s ran and no longer runs, and returns s to
// the pool: from s's actor (passivateMsg), or from the passivation if s's
// mailbox is idle (stopLocked). h.mu must be held.
func (h *Host) handBackLocked(s *shell, g *grain) {
	s.g = nil
	h.parkLocked(g)
	h.releaseShellLocked(s)
}

// shellLocked returns a shell to run g, from the pool or newly spawned
// (its grain set before protoactor starts it). h.mu must be held.
func (h *Host) shellLocked(g *grain) *shell {
	if n := len(h.shells); n > 0 {
		s := h.shells[n-1]
		h.shells[n-1] = nil
		h.shells = h.shells[:n-1]
		s.g = g
		return s
	}
	s := &shell{h: h, g: g}
	h.spawning.Store(s)
	h.spawnedMailbox = &s.mb
	s.pid = h.system.Root.Spawn(h.props)
	h.spawnedMailbox = nil
	h.stats.spawned.Add(1)
	return s
}

// send posts msg to the shell's mailbox, as protoactor's Send would.
func (s *shell) send(msg any) { s.mb.PostUserMessage(msg) }

// newMailbox is the shells' actor.MailboxProducer; protoactor calls it
// while spawning a shell (shellLocked, under h.mu), after produce: it
// returns the mailbox in the shell being spawned.
func (h *Host) newMailbox() actor.Mailbox {
	if m := h.spawnedMailbox; m != nil {
		return m
	}
	// Only shellLocked spawns with the shells' Props: a mailbox made
	// here would not be the one the host posts to.
	panic("actors: a shell's mailbox asked for outside shellLocked")
}

// releaseShellLocked returns a shell whose grain was passivated to the
// pool, or stops it if the pool is full or the host stopped. h.mu must be
// held.
func (h *Host) releaseShellLocked(s *shell) {
	if !h.stopped && len(h.shells) < h.maxShells {
		h.shells = append(h.shells, s)
		return
	}
	h.system.Root.Stop(s.pid)
}

// produce is the shells' actor.Producer: it returns the shell being
// spawned (shellLocked, under h.mu). Asked again, it is the supervisor
// restarting an actor after a panic that escaped the shell, which recovers
// its grain's (failing the host): the grain's state may be half applied, so
// the restarted actor fails the host rather than go on with it.
func (h *Host) produce() actor.Actor {
	if s := h.spawning.Swap(nil); s != nil {
		return s
	}
	return restartedShell{h}
}

type restartedShell struct{ h *Host }

func (r restartedShell) Receive(actor.Context) {
	r.h.fail(fmt.Errorf("actors: a grain's actor was restarted after a panic; its state may be half applied"))
}
