package actors

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Host runs the keys of one node. Create it with New, call Recover once, then
// Run until the context ends; Ingest and Query may be called from any
// goroutine once Recover returned.
type Host struct {
	cfg    Config
	store  persistence.Store
	packed bool // the store allows packed snapshots (packed.go); set by Recover
	// idIndex: the store keeps an id index (persistence.HasIDIndex; set by
	// Recover). While indexing is set (a checkpoint round sets it:
	// indexIDs), snapshots hold the keys' ids as fingerprints, and each id
	// is stored once, in the index (fold.SnapshotOptions.IDIndex).
	idIndex  bool
	indexing atomic.Bool
	// leftMemory counts the keys that left memory for want of room since
	// indexIDs last took the count (keyLeftMemory); indexUntil, under
	// indexMu, is until when it indexes.
	leftMemory atomic.Int64
	indexMu    sync.Mutex
	indexUntil time.Time

	log    *slog.Logger
	system *actor.ActorSystem

	queue chan *ingestReq

	// gate orders Ingest against shutdown: Ingest enqueues under RLock, and
	// closing takes the write lock, so nothing is enqueued after close.
	gate   sync.RWMutex
	closed bool

	// mu guards the registry of keys in memory and the groups'
	// bookkeeping. Messages to grains are sent while holding it, so a grain
	// is never passivated between being looked up and being sent to.
	mu   sync.Mutex
	keys grainIndex // every key in memory (registry.go, keyindex.go)
	lru  lru        // the active keys by last use
	// grains are the keys in the lists (lru.go): the active ones and the
	// resident tier's.
	grains grainTable
	// entered counts the grains that entered the registry, so that a
	// commit knows whether the keys it found in memory nowhere still are
	// (commit.go).
	entered uint64
	// groups are the key groups' bookkeeping, by group.
	groups []groupState
	// The keys held in memory without an actor (resident.go).
	resident resident
	// cache keeps what keys that left memory were, encoded (cache.go).
	cache snapshotCache

	// commitIndex finds a commit's batch of a key; kept (empty) between
	// commits, which the commit loop runs one at a time, so that each
	// does not grow a map of its thousands of keys anew (a twentieth of
	// the bytes allocated per event at a million keys, BENCHMARKS.md).
	commitIndex map[keyID]*keyBatch
	recordBuf   []byte // the commit's records, kept likewise

	// storeDown is set when an append failed with the store unreachable (not
	// fenced) and cleared by the next successful claim: meanwhile commits
	// fail at once instead of each waiting for the store's timeout.
	storeDown atomic.Bool

	// checkpointing holds one lock per group: its checkpoints (the loop's,
	// a release's) run one at a time (checkpoint.go).
	checkpointing []sync.Mutex
	checkpointNow chan struct{} // nudges the checkpoint loop
	snapshotting  chan struct{} // a token per group asking its keys for snapshots (checkpoint.go)
	passivateNow  chan struct{} // nudges the passivation loop
	// sinceCheckpoint counts the bytes logged since the last checkpoint
	// began (see CheckpointBytes).
	sinceCheckpoint atomic.Int64
	// deliveredSince counts the deliveries (a key's events of one commit)
	// handed to keys since then (see checkpointDeliveriesPerKey).
	deliveredSince atomic.Int64
	// roundBytes is what was logged between the last two checkpoints'
	// beginnings: the log the later covers.
	roundBytes atomic.Int64
	// lastRound is when the checkpoint loop's last round began (roundPace;
	// the loop's own); pacing is the pace of the round under way, if paced.
	lastRound time.Time
	pacing    atomic.Pointer[pacer]
	lostNow   chan struct{} // wakes the take-over loop

	failed   atomic.Pointer[error]
	failOnce sync.Once
	failCh   chan struct{}

	stats hostStats

	// layout is the store's key-group layout (a Layout), read by Recover;
	// joins are, by side pipeline, the joins it feeds (fixed at New).
	layout atomic.Uint32
	joins  map[string][]joinRef

	dispatcher *workerDispatcher // runs the grains' mailboxes
	// props spawn every shell, the actors that run the grains (one Props
	// for all: protoactor keeps a reference in each actor); spawning hands
	// it the shell to produce, and spawnedMailbox (under mu) the mailbox
	// in that shell. shells are the idle ones, under mu (shell.go).
	props          *actor.Props
	spawning       atomic.Pointer[shell]
	spawnedMailbox *grainMailbox
	shells         []*shell
	// maxShells bounds the idle shells (maxPooledShells; tests lower it);
	// stopped is set once stopAll ran, after which none is kept.
	maxShells int
	// afterFreeze, if set (by tests), runs in a group's checkpoint once it
	// took its keys and froze its spill, before it asks for snapshots.
	afterFreeze func(group uint32)
	// noStoredKeys (tests) makes the host keep no filters of stored keys,
	// as a keyfold from before them did (storedkeys.go).
	noStoredKeys bool
	stopped      bool

	// Event time (see timers.go). timed is set when a pipeline has windows
	// or patterns, expiring when one has a ttl; clocks are the node's
	// pipeline clocks, under mu.
	timed    bool
	expiring bool
	clocks   map[string]*fold.Clock
	// clockLogged is, by pipeline, the largest watermark a record logged
	// (or replayed) here lets a restart resume from (fold.Pipeline.Floor),
	// under mu: see idleLogStep.
	clockLogged map[string]int64
	outq        outputQueue
	outputs     outputsBroadcast
}

// joinRef names a join a pipeline feeds, and which side it is of it.
type joinRef struct {
	name string
	side int
}

type groupState struct {
	// owned is set while the host is to serve the group (see SetOwned);
	// ready while it does: it owns the group in the store and its keys'
	// memory matches its log; see recover.go.
	owned      bool
	ready      bool
	takingOver bool // a takeOver of the group is running
	// replaying is set while a take-over replays the group's log, after its
	// claim: the grains of its new epoch are current though the group is
	// not ready yet (a passivation during the replay parks them).
	replaying bool
	// epoch is the group's epoch in the store: the incarnation of its keys.
	epoch      persistence.Epoch
	spoiled    error                // a key failed to activate during the take-over in progress
	lastErr    error                // why the group was lost or its last take-over failed
	checkpoint persistence.Position // checkpoint position in the store
	dispatched persistence.Position // last record handed to the grains (see unchecked)
	// nowMs is the latest processing time of the records handed to the
	// grains (the group's clock), idsDropped the bucket of the store's id
	// index below which its last checkpoint dropped the ids (idDropBucket).
	nowMs, idsDropped int64
	// appended counts the bytes of the records handed to the grains since
	// the group's take-over (appended or replayed), covered those of them
	// its checkpoint covers: appended-covered is its log above the
	// checkpoint, what a restart would replay (checkpoint.go).
	appended, covered int64
	// dirty are the keys whose state is newer than their snapshots (each
	// knows the last position handed to it, grain.dirtyAt), in no order.
	dirty []*grain
	// clocks are the last pipeline clocks the group's log carried, as of
	// dispatched (the checkpoint stores them); timers index its keys by
	// their next timer, by pipeline. See timers.go.
	clocks map[string]*keyfoldv1.Watermark
	timers map[string]*timerIndex
	// expiry indexes the keys of pipelines with a ttl by when they expire
	// (processing time), by pipeline.
	expiry map[string]*timerIndex
	// parked are the group's keys in the resident tier (resident.go), in
	// no order. (Pointers, not their handles in the lists' table, lru.go:
	// a handle cost a parked key's removal a read of the table besides the
	// grain whose place it takes, more than the pointer costs the
	// collector; BENCHMARKS.md, session 57.)
	parked []*grain
	// spills are the group's arenas of spilled keys, spilled how many
	// keys are in them (spill.go).
	spills  []*spillArena
	spilled int
	// complete is set while every key of the group that may have a
	// snapshot is in memory (active, parked or being passivated): then a
	// key found in none of them is new, and needs no store read. It holds
	// from a take-over of a group that was never checkpointed until a key
	// of the group leaves memory (resident.go).
	complete bool
	// stored is the filter of the keys the store has a snapshot of
	// (storedkeys.go); nil: any may have one.
	stored *storedKeys
	// lastRound is what the group's last stored checkpoint wrote, by
	// which the next one sizes its lists.
	lastRound roundSize
}

// changed is the number of the group's keys changed since their snapshots:
// in memory (dirty) or spilled.
func (gs *groupState) changed() int { return len(gs.dirty) + gs.spilled }

// unchecked is the number of records handed to the group's keys above its
// checkpoint (CheckpointRecords bounds it).
func (gs *groupState) unchecked() uint64 {
	if gs.dispatched <= gs.checkpoint {
		return 0
	}
	return gs.dispatched - gs.checkpoint
}

type ingestReq struct {
	pipeline string
	events   []*fold.Event
	fires    []keyID // keys whose timers are due (the timer loop's requests)
	// ticks log the watermarks of pipelines in groups without listing any
	// key (the timer loop's idle advance, see idleLogStep).
	ticks []clockTick
	w     *waiter
}

// New returns a host. It does no I/O and starts nothing.
func New(cfg Config) (*Host, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Host{
		cfg:           cfg,
		store:         cfg.Store,
		log:           cfg.Logger,
		queue:         make(chan *ingestReq, 1024),
		keys:          newGrainIndex(),
		maxShells:     maxPooledShells,
		groups:        make([]groupState, cfg.Groups),
		checkpointing: make([]sync.Mutex, cfg.Groups),
		checkpointNow: make(chan struct{}, 1),
		passivateNow:  make(chan struct{}, 1),
		snapshotting:  make(chan struct{}, snapshotParallelism),
		lostNow:       make(chan struct{}, 1),
		failCh:        make(chan struct{}),
		clocks:        make(map[string]*fold.Clock),
		dispatcher:    newWorkerDispatcher(),
		clockLogged:   make(map[string]int64),
	}
	h.outputs.init()
	h.lru.t = &h.grains
	h.resident.init(&h.grains)
	h.resident.max = cfg.residentBudget()
	h.resident.spill.seed = maphash.MakeSeed()
	h.cache = newSnapshotCache(cfg.CacheMemory)
	h.stats.pipelines = make(map[string]*pipelineStats, len(cfg.Pipelines))
	h.layout.Store(uint32(LayoutKey))
	for _, name := range slices.Sorted(maps.Keys(cfg.Pipelines)) {
		p := cfg.Pipelines[name]
		h.stats.pipelines[name] = &pipelineStats{lateIn: make([]atomic.Int64, len(p.WindowNames())), windows: p.WindowNames(), join: p.IsJoin()}
		h.timed = h.timed || p.Timed()
		h.expiring = h.expiring || p.WakesByClock()
		if p.IsJoin() {
			if h.joins == nil {
				h.joins = map[string][]joinRef{}
			}
			for side, from := range p.JoinSides() {
				h.joins[from] = append(h.joins[from], joinRef{name, side})
			}
		}
	}
	// protoactor logs at INFO about every start and stop; keep only its
	// warnings, on our logger.
	quiet := slog.New(levelFilter{h.log.Handler(), slog.LevelWarn})
	h.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	h.props = actor.PropsFromProducer(h.produce, actor.WithDispatcher(h.dispatcher), actor.WithMailbox(h.newMailbox))
	return h, nil
}

// Run commits ingests, checkpoints and passivates until ctx ends; then it
// drains: it stops accepting, commits what was queued, writes a final
// checkpoint and stops the grains. It returns nil after a clean drain, or
// the error that failed the host.
func (h *Host) Run(ctx context.Context) error {
	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		h.commitLoop()
	}()
	takeOverCtx, stopTakeOver := context.WithCancel(ctx)
	takeOverDone := make(chan struct{})
	go func() {
		defer close(takeOverDone)
		h.takeOverLoop(takeOverCtx)
	}()
	// The timer loop enqueues into the commit queue: it stops before the
	// queue closes.
	timersCtx, stopTimers := context.WithCancel(ctx)
	timersDone := make(chan struct{})
	go func() {
		defer close(timersDone)
		h.timerLoop(timersCtx)
	}()
	go h.trimOutputsLoop(ctx)
	outputsDone := make(chan struct{})
	go func() {
		defer close(outputsDone)
		if h.timed {
			h.outputLoop(ctx)
		}
	}()
	// Passivation has a loop of its own: it needs no checkpoint (dirty
	// keys park too), and must not wait for one. (It ran between
	// checkpoints, and a checkpoint of a million keys kept the active keys
	// growing past MaxActive for its 15-25 s: BENCHMARKS.md, session 10.)
	passivateDone := make(chan struct{})
	go func() {
		defer close(passivateDone)
		h.passivateLoop(ctx)
	}()
	ticker := time.NewTicker(h.cfg.CheckpointInterval)
	defer ticker.Stop()
loop:
	for {
		why := "checkpoint_interval"
		select {
		case <-ctx.Done():
			break loop
		case <-h.failCh:
			break loop
		case <-ticker.C:
		case <-h.checkpointNow:
			if why = h.checkpointDue(); why == "" {
				continue // nudged during the last one, which covered it
			}
		}
		// The interval counts from the last round's start: it bounds the
		// time between checkpoints of a quiet node, and a ticker that ran
		// on through rounds the load began added a round in four at a
		// million keys (BENCHMARKS.md, session 42).
		ticker.Reset(h.cfg.CheckpointInterval)
		if err := h.checkpoint(ctx, true, why); err != nil && ctx.Err() == nil {
			// The changed keys stay dirty and are retried at the next
			// checkpoint; only replay after a crash grows meanwhile. (A
			// fenced group was lost and is being taken over again.) Clean
			// keys still passivate.
			h.log.Warn("checkpoint failed; retrying at the next one", "err", err)
		}
	}
	<-passivateDone
	stopTimers()
	<-timersDone
	h.gate.Lock()
	h.closed = true
	close(h.queue)
	h.gate.Unlock()
	<-commitDone
	<-outputsDone
	stopTakeOver()
	<-takeOverDone
	defer h.stopAll()
	if fe := h.failed.Load(); fe != nil {
		return *fe
	}
	// Final checkpoint, so the next start replays nothing (of the groups
	// being served; a lost group is replayed by its next owner).
	drainCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, st := time.Now(), h.Stats()
	if err := h.flushOutputs(drainCtx); err != nil {
		return fmt.Errorf("actors: final outputs: %w", err)
	}
	if err := h.checkpoint(drainCtx, false, "shutdown"); err != nil {
		return fmt.Errorf("actors: final checkpoint: %w", err)
	}
	// Groups not served (lost to a failing store, being taken over) have
	// nothing to write: their next owner replays their logs.
	h.log.Info("final checkpoint written", "keys", st.DirtyKeys, "unserved_groups", st.GroupsUnavailable, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// stopAll stops every grain and the actor system. (protoactor's Shutdown
// alone leaves running actors be.)
func (h *Host) stopAll() {
	h.mu.Lock()
	for g := h.lru.front(); g != nil; {
		next := h.grains.next(g)
		h.system.Root.Stop(g.sh.pid)
		h.deactivateLocked(g)
		h.forgetLocked(g)
		g = next
	}
	for _, s := range h.shells {
		h.system.Root.Stop(s.pid)
	}
	h.shells, h.stopped = nil, true
	for g := range h.groups {
		h.dropParkedLocked(uint32(g))
	}
	h.keys.clear() // (the stopping ones)
	h.cache.reset()
	h.mu.Unlock()
	h.system.Shutdown()
	h.dispatcher.close()
}

// fail stops the host after an error it cannot recover from by itself (a
// corrupt log record, a grain that panicked). The process must restart;
// recovery replays the log.
func (h *Host) fail(err error) {
	h.failOnce.Do(func() {
		err = fmt.Errorf("%w: %w", ErrFailed, err)
		h.failed.Store(&err)
		h.log.Error("host failed; restart to recover", "err", err)
		close(h.failCh)
	})
}

// Err returns the error that failed the host, or nil.
func (h *Host) Err() error {
	if p := h.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Result is the outcome of one ingest, as every layer gives it (the
// embedding API's keyfold.IngestResult, the transports' answers).
type Result struct {
	Accepted   int `json:"accepted"`   // events applied
	Duplicates int `json:"duplicates"` // events skipped: their id was already applied
}

// Ingest validates a batch of events of one pipeline (each a JSON object),
// logs it durably and applies it to its keys. An invalid event rejects the
// whole batch with a *fold.BatchError, before anything is logged. Ingest
// returns only after every event is in its group's log, synced, and applied.
// If ctx ends first the events may still be applied; retrying events that
// carry ids is safe. The host keeps raws (it logs and applies the events
// from them, maybe after ctx ends): the caller must not change them.
func (h *Host) Ingest(ctx context.Context, pipeline string, raws [][]byte) (Result, error) {
	p, err := h.Submit(ctx, pipeline, raws)
	if err != nil {
		return Result{}, err
	}
	return p.Wait(ctx)
}

// Pending is an ingest that was validated and queued for logging: with
// this host (Submit), or in a cluster with the owners of its keys. Every
// layer above passes it on as it is (keyfold.PendingIngest).
type Pending interface {
	// Wait waits until the batch is logged and applied, or ctx ends (the
	// batch may then still be applied).
	Wait(ctx context.Context) (Result, error)
}

// queued is an ingest queued with this host.
type queued struct {
	h *Host
	w *waiter // nil for an empty batch
	n int
}

// Submit validates a batch as Ingest does and queues it for logging, then
// returns without waiting: batches submitted one after the other are logged
// and applied in that order (what a stream of batches needs). Wait for the
// outcome with Pending.Wait.
func (h *Host) Submit(ctx context.Context, pipeline string, raws [][]byte) (Pending, error) {
	p, ok := h.cfg.Pipelines[pipeline]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	}
	events, err := p.PrepareBatch(raws)
	if err != nil {
		return nil, err
	}
	return h.SubmitEvents(ctx, pipeline, events)
}

// SubmitEvents is Submit for events already prepared (validated) by the
// pipeline's PrepareBatch. A batch that has an event of a key group the
// host does not serve when the commit loop takes it (not owned, or being
// taken over) is refused whole: its Wait fails with an error wrapping
// ErrNotServed, and nothing of it is logged. (A group lost between that
// check and the write still fails alone.)
func (h *Host) SubmitEvents(ctx context.Context, pipeline string, events []*fold.Event) (Pending, error) {
	if p, ok := h.cfg.Pipelines[pipeline]; !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	} else if p.IsJoin() {
		return nil, fmt.Errorf("%w (join %q)", fold.ErrJoinIngest, pipeline)
	}
	if len(events) == 0 {
		return &queued{}, nil
	}
	q, err := h.enqueue(ctx, pipeline, events)
	if err != nil {
		return nil, err // not a nil *queued in a Pending
	}
	return q, nil
}

// GroupOf returns the key group of a pipeline's key in the store's layout
// (read by Recover; LayoutKey before). Every node on a store agrees.
func (h *Host) GroupOf(pipeline, key string) uint32 {
	return Layout(h.layout.Load()).GroupOf(pipeline, key, h.cfg.Groups)
}

// Layout returns the store's key-group layout (read by Recover).
func (h *Host) Layout() Layout { return Layout(h.layout.Load()) }

// checkServedLocked fails with ErrNotServed if an event's group is not
// served. h.mu must be held.
func (h *Host) checkServedLocked(pipeline string, events []*fold.Event) error {
	for _, ev := range events {
		g := h.GroupOf(pipeline, ev.Key)
		if gs := &h.groups[g]; !gs.ready || !gs.owned {
			return fmt.Errorf("%w: %w", ErrNotServed, gs.unavailable(g))
		}
	}
	return nil
}

// enqueue hands events to the commit loop.
func (h *Host) enqueue(ctx context.Context, pipeline string, events []*fold.Event) (*queued, error) {
	req := &ingestReq{pipeline: pipeline, events: events, w: newWaiter()}
	h.gate.RLock()
	defer h.gate.RUnlock()
	if h.closed {
		return nil, ErrClosed
	}
	select {
	case h.queue <- req:
		return &queued{h: h, w: req.w, n: len(events)}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *queued) Wait(ctx context.Context) (Result, error) {
	if p.w == nil {
		return Result{}, nil
	}
	select {
	case <-p.w.done:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-p.h.failCh: // its grains may never answer
		select {
		case <-p.w.done:
		default:
			return Result{}, p.h.Err()
		}
	}
	dups, err := p.w.result()
	if err != nil {
		return Result{}, err
	}
	return Result{Accepted: p.n - dups, Duplicates: dups}, nil
}

// Delete erases a key: its state, the ids it remembers and, at the next
// checkpoint, its snapshot. The deletion is logged (a tombstone) like an
// event, so it is durable when Delete returns and replay repeats it; events
// logged after it start the key afresh. Deleting a key without state
// succeeds.
func (h *Host) Delete(ctx context.Context, pipeline, key string) error {
	if _, ok := h.cfg.Pipelines[pipeline]; !ok {
		return fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	}
	if err := fold.CheckKey(key); err != nil {
		return err
	}
	p, err := h.enqueue(ctx, pipeline, []*fold.Event{fold.Tombstone(key)})
	if err != nil {
		return err
	}
	_, err = p.Wait(ctx)
	return err
}

// Query returns a key's state, read through its grain, so it reflects every
// ingest acknowledged before the call. A key without state is ErrNotFound.
func (h *Host) Query(ctx context.Context, pipeline, key string) (KeyView, error) {
	if _, ok := h.cfg.Pipelines[pipeline]; !ok {
		return KeyView{}, fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	}
	msg := &queryMsg{reply: make(chan queryReply, 1)}
	if err := h.sendRead(pipeline, key, msg); err != nil {
		return KeyView{}, err
	}
	select {
	case r := <-msg.reply:
		if errors.Is(r.err, ErrNotFound) {
			return KeyView{}, fmt.Errorf("%w: %q in pipeline %q", ErrNotFound, key, pipeline)
		}
		return r.view, r.err
	case <-ctx.Done():
		return KeyView{}, ctx.Err()
	case <-h.failCh:
		return KeyView{}, h.Err()
	}
}

// spawnLocked gives g, a key in the registry that is not active, an actor
// (a shell, shell.go), and makes it the most recently used; h.mu must be
// held.
func (h *Host) spawnLocked(g *grain) {
	s := h.shellLocked(g)
	g.tier, g.sh, g.lastUsed, g.used = tierActive, s, time.Now().UnixNano(), false
	h.lru.pushFront(g)
	h.stats.activations.Add(1)
	// (The message the caller sends next loads the key's state: shell.go.)
}

// sendRead sends a read of a key (a query, a read-only call) to its grain,
// unless the host cannot serve it. A parked key answers a query without an
// actor.
func (h *Host) sendRead(pipeline, key string, msg any) error {
	if err := h.Err(); err != nil {
		return err
	}
	h.gate.RLock()
	closed := h.closed
	h.gate.RUnlock()
	if closed {
		return ErrClosed
	}
	id := keyID{pipeline, key}
	g := h.GroupOf(pipeline, key)
	h.mu.Lock()
	// Not once released either: the next owner may already take writes.
	if gs := &h.groups[g]; !gs.ready || !gs.owned {
		err := gs.unavailable(g)
		h.mu.Unlock()
		return err
	}
	q, query := msg.(*queryMsg)
	if k := h.lookupLocked(id, g); query && k != nil && k.tier == tierParked {
		// Nothing else touches a parked key: it needs no actor to answer.
		k.handleHeld(q)
	} else {
		h.sendLocked(id, g, msg)
	}
	over := h.lru.n > h.cfg.MaxActive
	h.mu.Unlock()
	if over { // reads of unseen keys activate grains too
		h.nudgePassivate()
	}
	return nil
}

// newGrainLocked returns a new grain for a key not in memory: from l if its
// snapshot was read already, else from the spill if it is there (dirty, as
// it left), else from the snapshot cache, else from the store (unless the
// key is known to be new). (A key read already was not spilled then, and
// cannot be since: activate.go.) h.mu must be held.
func (h *Host) newGrainLocked(id keyID, group uint32, l *loaded) *grain {
	gs := &h.groups[group]
	var (
		dirtyAt persistence.Position
		lastNow int64
	)
	if l == nil {
		l, dirtyAt, lastNow = h.unspillLocked(id, group)
	}
	if l == nil && !gs.complete {
		// (Its entry stays: the key replaces or deletes it as it leaves
		// memory again, cache.go.)
		l = h.cache.get(id, gs.epoch)
	}
	if l == nil && (gs.complete || !gs.stored.mayHave(id)) {
		l = newKey // nothing to read
	}
	if l == newKey {
		h.stats.newKeys.Add(1)
	}
	g := &grain{host: h, id: id, group: group, epoch: gs.epoch, pipeline: h.cfg.Pipelines[id.pipeline],
		pstats: h.stats.pipelines[id.pipeline], preloaded: l, lastNow: lastNow}
	if n := len(id.key); n > 0 && n <= grainKeyBytes && !g.pipeline.HasHandler() {
		// The key's bytes beside the fields read with them (grain), not
		// in the allocation of the event that activated it. What keeps
		// the key after the grain left memory copies it (the timer
		// index, the spill, the snapshot cache); a Go handler is handed
		// the key and may keep it, and would keep the grain with it, so
		// its keys stay as they came.
		copy(g.keyBytes[:], id.key)
		g.id.key = unsafe.String(&g.keyBytes[0], n)
	}
	if l != nil && l.spilled {
		h.markDirtyLocked(g, dirtyAt) // it left memory changed
	}
	return g
}

// sendLocked sends msg to the key's grain, activating it if needed, and
// returns the grain. h.mu must be held.
func (h *Host) sendLocked(id keyID, group uint32, msg any) *grain {
	return h.sendLoadedLocked(id, group, msg, nil)
}

// sendLoadedLocked is sendLocked for a key whose snapshot may have been read
// already (l, nil if not): a grain it activates starts from l instead of
// reading the store. h.mu must be held.
func (h *Host) sendLoadedLocked(id keyID, group uint32, msg any, l *loaded) *grain {
	g := h.lookupLocked(id, group)
	if g == nil { // (a grain of a dropped incarnation still stopping is replaced)
		return h.activateLocked(id, group, msg, l)
	}
	h.deliverLocked(g, msg)
	return g
}

// activateLocked sends msg to a key that is not in memory (lookupLocked
// finds no grain of it), in a new grain from l (newGrainLocked). h.mu must
// be held.
func (h *Host) activateLocked(id keyID, group uint32, msg any, l *loaded) *grain {
	g := h.newGrainLocked(id, group, l)
	h.keys.put(g)
	h.entered++
	h.spawnLocked(g)
	g.sh.send(msg)
	return g
}

// deliverLocked sends msg to a key in memory (as lookupLocked finds it),
// giving it an actor if it has none. h.mu must be held.
func (h *Host) deliverLocked(g *grain, msg any) {
	switch g.tier {
	case tierActive:
		// Not moved to the front of the order of use here: that reads
		// both neighbours, two cache misses per event once the grains do
		// not fit the CPU's caches. Passivation moves it when it meets it
		// (passivate).
		g.used = true
		g.lastUsed = time.Now().UnixNano()
	case tierStopping:
		// Its actor is passivating it: the message waits, and goes to a
		// new actor around the same grain (resident.go).
		g.stop.waiting = append(g.stop.waiting, msg)
		return
	default: // parked
		h.unparkLocked(g)
		h.stats.unparked.Add(1)
		h.spawnLocked(g)
	}
	g.sh.send(msg)
}
