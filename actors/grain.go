package actors

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Messages of a grain. They carry Go channels and pointers: grains are local
// to their host; routing between nodes happens before a batch reaches one.

// applyMsg hands a key its inputs from the log record at pos. A key of a
// pipeline with windows first advances to the watermark wm.
type applyMsg struct {
	pos  persistence.Position
	wm   int64
	segs []segment
}

// segment is a run of one ingest call's events for the key, all logged with
// the same processing time. w is nil during replay.
type segment struct {
	nowMs  int64
	events []*fold.Event
	w      *waiter
	// side is, for a join's key, the side the events are of (0 left, 1
	// right); their waiter is their side key's. derived is set for such
	// events: they are logged under their side, not the join's key.
	side    int
	derived bool
}

type queryMsg struct{ reply chan queryReply }

type queryReply struct {
	view KeyView
	err  error
}

type snapshotMsg struct{ reply chan snapshotReply }

type snapshotReply struct {
	g   *grain
	pos persistence.Position
	// core and buckets are the store entries to write: the key's snapshot
	// (an encoded keyfold.v1.Snapshot or, packed, packed.go's form; nil
	// Data when the key holds no state) and its changed id buckets.
	core    persistence.Snapshot
	buckets []persistence.Snapshot
	packed  bool   // core is in the packed form: its pipeline's shape is stored with it
	version uint64 // the state version they reflect; acknowledged by markSaved
	// ids are the ids the snapshot holds as fingerprints that the store's
	// id index lacks: stored in it with the snapshot (fold.Parts.IDs).
	ids []fold.IndexedID
	// For a pipeline with windows or patterns: the key's next timer.
	timed bool
	due   int64
	// For a pipeline whose keys wake by processing time (a ttl, a Go
	// handler): when the key is next woken (fold.Pipeline.WakeAt; 0:
	// never).
	ttl    bool
	expiry int64
	err    error
}

// KeyView is what a query returns about one key.
type KeyView struct {
	Seq        uint64
	Duplicates uint64
	Aggregates map[string]any
	// For a pipeline with windows: the key's watermark (Unix ms), its
	// events too late for every window, its windows, and per window name
	// its events too late for at least one window of that name.
	Watermark   int64
	Late        uint64
	Windows     []fold.WindowView
	LateWindows map[string]uint64
	Patterns    []fold.PatternView
	// For a pipeline with a Go handler: the key's handler state as JSON
	// (nil while it has none) and the handler's calls that failed.
	State           json.RawMessage
	HandlerFailures uint64
	// For a join: its buffered events per side and its results.
	Join *fold.JoinView
}

// grain is one key in memory: it owns the key's fold.State, and only the
// key's actor (its shell, shell.go) touches it while the key is active,
// but for a checkpoint's snapshot while that actor is idle, taken under
// h.mu, by which anything would reach the actor (snapshotKeys).
//
// Its fields are laid out by who uses them (a grain takes 448 bytes, a
// size class whose objects start at a cache line; TestGrainLayout): the
// first line holds what never changes and the commit loop and the actor
// both read (the key, its bytes when it is short, the epoch); the second
// what the commit loop and passivation write under h.mu for every event
// sent to the key (registry.go); the rest is the actor's. Spread over the
// struct, with the key's bytes in an allocation of their own, the commit
// loop's reads and writes of a key were four or five cache misses per
// event at a hundred thousand keys and more, where the grains do not fit
// the CPU's caches (BENCHMARKS.md, session 34); and a line both sides
// write moves between their cores at each event.
type grain struct {
	id       keyID             // its key is in keyBytes if it fits (newGrainLocked)
	epoch    persistence.Epoch // the group incarnation it belongs to
	keyBytes [grainKeyBytes]byte

	// In the host's registry of keys in memory (registry.go), under h.mu:
	// where the key is (active, stopping, parked), its actor while active
	// and when it was last sent to (used: since it took its place in the
	// order of use, which passivation then moves it up from); its place in
	// the order of use (of the active keys) or of parking (of the parked
	// ones), and in its group's parked keys; whether and since which
	// position it is dirty, and its place among its group's dirty keys. In
	// the resident tier (resident.go): which of its lists it is in, and
	// while its actor stops, what waits for it; spilled is set once the
	// key left memory into the spill (spill.go).
	group    uint32
	tier     tier
	rlist    rlist
	spilled  bool
	used     bool
	sh       *shell
	lastUsed int64  // unix nanos
	slot     uint32 // its handle in the lists' table (lru.go) while in a list; 0: none
	parkIdx  int32  // index+1 in groupState.parked; 0: not parked
	dirtyIdx int32  // index+1 in groupState.dirty; 0: clean
	dirtyAt  persistence.Position
	stop     *stoppingGrain
	rsize    int64 // its estimated size while parked (resident.go)

	// current is set once the state in memory is the key's: loaded, or
	// kept while the key was parked (resident.go), so a new actor around
	// the grain does not read the store.
	current  bool
	host     *Host
	pipeline *fold.Pipeline
	pstats   *pipelineStats // its pipeline's counters
	state    fold.State
	pos      persistence.Position // last log position applied
	stored   uint64               // state version whose snapshot is stored (0: none)
	savedAt  atomic.Uint64        // the version a checkpoint stored since, for stored (markSaved)
	broken   error                // set when activation failed; the group is lost
	reported int64                // the next timer the host's index has
	expiry   int64                // when the host's index says the key wakes by processing time (0: never)
	lastNow  int64                // the latest processing time of its inputs
	// counted is, for a join's key, what it adds to the join's buffered
	// gauge: its buffered events as of its last apply in memory.
	counted int64
	// preloaded is the key's snapshot if the commit that activated it read
	// it already (activate.go); nil: the grain reads it.
	preloaded *loaded
}

// grainKeyBytes is the longest key a grain keeps in its own bytes (longer
// ones are their own allocation): it fills the grain to its size class.
const grainKeyBytes = 24

// handle processes one of the grain's own messages.
func (g *grain) handle(m any) {
	switch m := m.(type) {
	case *applyMsg:
		g.apply(m)
	case *queryMsg:
		m.reply <- g.query()
	case *readCallMsg:
		m.reply <- g.readCall(m) // call.go
	case *snapshotMsg:
		m.reply <- g.snapshot()
	}
}

// markSaved records that the key's snapshot of version is stored; the
// grain takes it into account at its next snapshot. Safe from any
// goroutine: a checkpoint tells keys whose actors may be running.
func (g *grain) markSaved(version uint64) {
	for {
		was := g.savedAt.Load()
		if version <= was || g.savedAt.CompareAndSwap(was, version) {
			return
		}
	}
}

// activate restores the key from its snapshot. A passivated key always has
// a current one, so activation is one read, and one more for the ids it
// remembers (in time buckets) if it has any.
func (g *grain) activate() {
	if g.current {
		return // parked with its state (resident.go)
	}
	if err := g.load(); err != nil {
		// Inputs sent to this key would be lost with it: drop its group and
		// take it over again (asynchronously: the host's lock may be held
		// by whoever is sending to this grain).
		g.broken = fmt.Errorf("actors: activate %s/%s: %w", g.id.pipeline, g.id.key, err)
		go g.host.lose(g.group, g.epoch, g.broken)
	}
}

func (g *grain) load() error {
	l := g.preloaded
	g.preloaded = nil
	g.current = true
	if l != nil && l.cached != nil {
		state, pos, err := decodeCached(g.pipeline, l.cached)
		switch {
		case err == nil:
			g.restored(pos, state)
			return nil
		case l.spilled:
			// (Not expected: the spill holds what it encoded.) The store's
			// snapshot is older: the group's log must replay the key.
			return fmt.Errorf("spilled state: %w", err)
		default: // (not expected: the cache holds what put encoded) the store has it
			g.host.log.Warn("snapshot cache: decode failed; reading the store", "pipeline", g.id.pipeline, "key", g.id.key, "err", err)
			l = nil
		}
	}
	if l == nil {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		ls, err := loadKeys(ctx, g.host.store, g.host.cfg.Pipelines, []keyAt{{g.id, g.group}})
		if err != nil {
			return err
		}
		l = &ls[0]
	}
	if !l.found {
		return nil // a new key
	}
	g.restored(l.pos, *l.state)
	return nil
}

// restored takes the key's state as its snapshot (or the cache's copy of
// it) has it.
func (g *grain) restored(pos persistence.Position, state fold.State) {
	g.pos, g.state = pos, state
	g.reported = g.pipeline.NextTimer(&g.state) // what the store's index says
	g.expiry = g.pipeline.WakeAt(&g.state, 0)
	// Everything restored is stored, unless RestoreParts asked for a
	// rewrite (a new bucket layout) by starting past it.
	g.stored = min(g.state.Version(), fold.RestoredVersion)
}

func (g *grain) apply(m *applyMsg) {
	if g.broken != nil {
		// The inputs are in the log: the take-over of the group replays
		// them, so their ingest succeeded (its duplicates uncounted).
		finishUnapplied(m.segs)
		return
	}
	if m.pos <= g.pos { // replay of a record the snapshot already reflects
		finishUnapplied(m.segs)
		return
	}
	// The late counts before the apply, per window (on the stack for up
	// to 8 windows: a key in memory keeps nothing for them).
	late := g.state.Late()
	var buf [8]uint64
	var lateIn []uint64
	if n := len(g.pstats.lateIn); n <= len(buf) {
		lateIn = buf[:n]
	} else {
		lateIn = make([]uint64, n)
	}
	for i := range lateIn {
		lateIn[i] = g.state.LateIn(i)
	}
	if m.wm > 0 {
		g.pipeline.Advance(&g.state, g.id.key, m.wm)
	}
	for i, s := range m.segs {
		g.lastNow = max(g.lastNow, s.nowMs)
		dups, events := 0, 0
		for _, ev := range s.events {
			switch {
			case ev.Expire:
				g.expire(ev, s.nowMs)
				continue
			case ev.Call:
				g.call(ev, s)
				continue
			}
			events++
			if g.pipeline.IsJoin() {
				g.pipeline.ApplySide(&g.state, s.side, ev, s.nowMs) // (a join's duplicates are not the ingest's)
				continue
			}
			v := g.pipeline.ApplyEvent(&g.state, ev, s.nowMs)
			if v == fold.LookUp {
				if err := g.lookUpID(ev); err != nil {
					// Undecided: the key's state can go no further. The
					// group's take-over replays the log from its
					// checkpoint (as after a failed activation), these
					// inputs too: their ingest succeeded.
					g.broken = fmt.Errorf("actors: %s/%s: look up the id of an event in the store's id index: %w", g.id.pipeline, g.id.key, err)
					go g.host.lose(g.group, g.epoch, g.broken)
					finishUnapplied(m.segs[i:])
					return
				}
				v = g.pipeline.ApplyEvent(&g.state, ev, s.nowMs)
			}
			if v == fold.Duplicate {
				dups++
			}
		}
		// Duplicates count what the replies say: a replay skips a logged
		// duplicate again, which its first process counted already.
		counted := dups
		if s.w == nil {
			counted = 0
		}
		if !g.pipeline.IsJoin() { // counted by their side
			g.host.stats.events.Add(int64(events))
			g.host.stats.duplicates.Add(int64(counted))
		}
		g.pstats.events.Add(int64(events))
		g.pstats.duplicates.Add(int64(counted))
		s.w.finish(dups, nil)
	}
	g.pos = m.pos
	if g.pipeline.WakesByClock() {
		// The index may say earlier than the truth (a wake-up finds the key
		// busy and reports again), never later: report when the wake-up
		// moved by an eighth of the ttl, so a busy key does not report per
		// batch.
		exp := g.pipeline.WakeAt(&g.state, g.lastNow)
		if exp == 0 || g.expiry == 0 || exp < g.expiry || exp-g.expiry > g.pipeline.TTL().Milliseconds()/8 {
			if exp != g.expiry {
				g.expiry = exp
				g.host.setTimer(g.group, g.epoch, g.id, exp, true)
			}
		}
	}
	if g.pipeline.Timed() {
		if l := g.state.Late(); l >= late {
			g.pstats.late.Add(int64(l - late))
		} else { // erased meanwhile: what came after
			g.pstats.late.Add(int64(l))
		}
		for i, was := range lateIn {
			if l := g.state.LateIn(i); l >= was {
				g.pstats.lateIn[i].Add(int64(l - was))
			} else {
				g.pstats.lateIn[i].Add(int64(l))
			}
		}
		if g.pipeline.IsJoin() {
			n := int64(g.state.Buffered())
			g.pstats.buffered.Add(n - g.counted)
			g.counted = n
		}
		if outs := g.state.TakeOutputs(); len(outs) > 0 {
			g.countOutputs(outs) // handlers.go
			g.host.queueOutputs(g.id.pipeline, outs)
		}
		// A key listed without inputs had a timer due: its index entry was
		// taken out, so it always reports back.
		if next := g.pipeline.NextTimer(&g.state); next != g.reported || len(m.segs) == 0 {
			g.reported = next
			g.host.setTimer(g.group, g.epoch, g.id, next, false)
		}
	}
}

// finishUnapplied answers the waiters of segments the grain does not
// apply (their inputs are logged: a replay applies them), no duplicates
// counted.
func finishUnapplied(segs []segment) {
	for _, s := range segs {
		s.w.finish(0, nil)
	}
}

// lookUpID asks the store's id index whether the key applied ev's id,
// which ApplyEvent could not tell (it holds the fingerprint of an id
// applied before its state was restored), and gives ev the answer.
func (g *grain) lookUpID(ev *fold.Event) error {
	ats := g.pipeline.IDLookups(&g.state, ev)
	lookups := make([]persistence.IDLookup, 0, len(ats))
	key := g.id.snapshotKey()
	for _, at := range ats {
		b := fold.IndexBucket(at)
		if n := len(lookups); n == 0 || lookups[n-1].Bucket != b {
			lookups = append(lookups, persistence.IDLookup{Bucket: b, Key: key, ID: ev.ID})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	found, err := g.host.store.LookupIDs(ctx, g.group, lookups)
	if err != nil {
		return err
	}
	g.host.stats.idLookups.Add(1)
	ev.SetIndexed(slices.Max(append(found, 0)))
	return nil
}

// expire applies an expiry check; a key it does not erase was busy, and its
// index entry (taken out to wake it) is reported again.
func (g *grain) expire(ev *fold.Event, nowMs int64) {
	was := g.state.Seq()
	g.pipeline.Apply(&g.state, ev, nowMs)
	if was > 0 && g.state.Seq() == 0 {
		g.pstats.expired.Add(1)
	}
	g.expiry = -1 // always report
}

func (g *grain) query() queryReply {
	if g.broken != nil {
		return queryReply{err: fmt.Errorf("%w: %w", ErrUnavailable, hideStore("loading the key", g.broken))}
	}
	if !g.state.Holds() || g.state.Empty() { // never applied an event or a call, or erased (or a join's key, nothing buffered)
		return queryReply{err: ErrNotFound}
	}
	v := KeyView{Seq: g.state.Seq(), Duplicates: g.state.Duplicates(), Aggregates: g.pipeline.Aggregates(&g.state)}
	if g.pipeline.Timed() {
		v.Watermark, v.Late, v.Windows = g.state.Watermark(), g.state.Late(), g.pipeline.Windows(&g.state)
		v.Patterns = g.pipeline.Patterns(&g.state)
		v.LateWindows = g.pipeline.LateByWindow(&g.state)
		v.Join = g.pipeline.Join(&g.state)
	}
	if err := g.queryHandler(&v); err != nil { // handlers.go
		return queryReply{err: err}
	}
	return queryReply{view: v}
}

// panicked fails the host and the key after a panic p in the grain's code
// (a Go handler's codec is the user's), as shell.Receive does on the key's
// actor, and returns the error.
func (g *grain) panicked(p any) error {
	err := fmt.Errorf("actors: grain %s/%s panicked: %v", g.id.pipeline, g.id.key, p)
	g.broken = err
	g.host.fail(err)
	return err
}

// heldSnapshot is snapshot for a checkpoint that holds the grain itself
// (a parked key, or an active one whose actor is idle, snapshotKeys): a
// panic fails the host and the key instead of ending the process, and is
// the reply's error.
func (g *grain) heldSnapshot() (r snapshotReply) {
	defer func() {
		if p := recover(); p != nil {
			r = snapshotReply{g: g, err: g.panicked(p)}
		}
	}()
	return g.snapshot()
}

// handleHeld is handle for what the host answers itself, under h.mu, for a
// key no actor runs (a query of a parked key, what waited for a stopping
// one: resident.go): a panic fails the host and the key instead of ending
// the process (whoever waits for the answer sees the host fail).
func (g *grain) handleHeld(m any) {
	defer func() {
		if p := recover(); p != nil {
			g.panicked(p)
		}
	}()
	g.handle(m)
}

// catchUpSaved tells the key's state what the last checkpoint stored of it
// (markSaved), if it was not told yet: which parts of its id buckets are
// stored. Only whoever holds the grain may (its actor, or the host under
// h.mu for a key without one).
func (g *grain) catchUpSaved() {
	if v := g.savedAt.Load(); v > g.stored { // the last checkpoint's
		g.state.Persisted(v)
		g.stored = v
	}
}

func (g *grain) snapshot() snapshotReply {
	r := snapshotReply{g: g, pos: g.pos}
	if g.broken != nil {
		r.err = g.broken
		return r
	}
	g.catchUpSaved()
	// The core is encoded after room for the Snapshot's header (or after
	// the packed form's), sized by the pipeline's last one: one allocation
	// for the stored bytes.
	var (
		buf   []byte
		room  int
		parts fold.Parts
		err   error
	)
	o := fold.SnapshotOptions{IDIndex: g.host.indexing.Load(), PackedParts: g.host.packed}
	if shape, shapeID := g.pipeline.Shape(); g.host.packed && shape != nil && g.state.OnePart() {
		buf = appendPackedHeader(make([]byte, 0, packedHeaderRoom+int(g.pstats.coreSize.Load())+64), shapeID, g.pos)
		room = len(buf)
		o.Packed = true
	} else {
		room = snapshotHeaderRoom(g.id)
		if !g.pipeline.Timed() {
			buf = make([]byte, room, room+int(g.pstats.coreSize.Load())+64)
		}
	}
	parts, err = g.pipeline.Snapshot(&g.state, g.stored, buf, o)
	if err != nil {
		r.err = err
		return r
	}
	r.version, r.ids = parts.Version, parts.IDs
	var core persistence.Snapshot // nil Data deletes; its Key is the checkpoint's to name (appendSnapshot)
	switch {
	case g.state.Empty():
	case parts.CoreData != nil:
		g.pstats.coreSize.Store(int64(len(parts.CoreData) - room))
		if r.packed = parts.Packed; r.packed {
			core.Data = parts.CoreData // the header is in front already
		} else {
			core.Data = prependSnapshotHeader(parts.CoreData, room, g.id, g.pos)
		}
	default:
		core.Data, r.err = proto.Marshal(&keyfoldv1.Snapshot{
			Pipeline: g.id.pipeline,
			Key:      g.id.key,
			Position: g.pos,
			State:    parts.Core,
		})
	}
	r.core = core
	for _, b := range parts.Buckets {
		r.buckets = append(r.buckets, persistence.Snapshot{Key: g.id.bucketKey(b.Bucket, b.Part), Data: b.Data})
	}
	if g.pipeline.WakesByClock() {
		r.ttl, r.expiry = true, g.pipeline.WakeAt(&g.state, g.lastNow)
	}
	if g.pipeline.Timed() {
		r.timed, r.due = true, parts.NextTimer
	}
	return r
}

// appendSnapshotHeader appends what precedes a state of n bytes in its
// keyfold.v1.Snapshot.
func appendSnapshotHeader(b []byte, id keyID, pos persistence.Position, n int) []byte {
	b = appendStringField(b, 1, id.pipeline)
	b = appendStringField(b, 2, id.key)
	if pos != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, pos)
	}
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// snapshotHeaderRoom is the most bytes a Snapshot header of the key takes.
func snapshotHeaderRoom(id keyID) int {
	return 2*(1+binary.MaxVarintLen64) + len(id.pipeline) + len(id.key) + (1 + binary.MaxVarintLen64) + (1 + binary.MaxVarintLen64)
}

// prependSnapshotHeader turns data, a state encoded after room bytes, into
// the key's keyfold.v1.Snapshot at pos, in place: the header is written
// just before the state (the unused front of the room stays unused).
func prependSnapshotHeader(data []byte, room int, id keyID, pos persistence.Position) []byte {
	var tmp [128]byte
	hdr := appendSnapshotHeader(tmp[:0], id, pos, len(data)-room)
	start := room - len(hdr)
	copy(data[start:room], hdr)
	return data[start:]
}
