package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
)

// checkpointParallelism bounds the groups checkpointed at once; their synced
// writes share fsyncs in the store.
const checkpointParallelism = 16

// checkpoint writes, for every group with changed keys, the snapshots of
// those keys and then advances the group's checkpoint position (trimming its
// log), so replay after a crash starts there. The loop runs one every
// CheckpointInterval, and earlier as checkpointDue says: once
// CheckpointBytes were logged since the last one began or a group has
// CheckpointRecords above its checkpoint, if the keys changed since took two
// deliveries each, and at CheckpointMaxBytes (or records in that
// proportion) whatever they took.
//
// (Checkpointing a few groups at a time as they come due, instead of all
// at once, was tried and measured: the ack p99 at half load got worse, on
// Redis 38 -> 484 ms. BENCHMARKS.md, session 9; branch paced-checkpoints.
// What paces a round now is a rate of snapshots over all its groups.)
//
// A round of the loop (paced) spreads its snapshots over paceShare of the
// time since the loop's last round began (roundPace); the final one at
// shutdown runs as fast as it can. why is what asked for it (the debug log
// says).
func (h *Host) checkpoint(ctx context.Context, paced bool, why string) error {
	begin := time.Now()
	// What is logged from here on is the next one's; what was, this one's
	// (the log above the checkpoints until it ends: see hurryCheckpoint).
	h.roundBytes.Store(h.sinceCheckpoint.Swap(0))
	delivered := h.deliveredSince.Swap(0)
	h.indexing.Store(h.indexIDs(begin))
	var pace *pacer
	if paced {
		pace = h.roundPace(begin)
		h.pacing.Store(pace)
		defer h.pacing.Store(nil)
	}
	var groups errgroup.Group // every group is tried; the first error is returned
	groups.SetLimit(checkpointParallelism)
	// What the log held and the keys changed as the round begins (the
	// loop below waits for free slots, so it reads later groups later).
	logged, changed := int64(0), 0
	h.mu.Lock()
	for g := range h.groups {
		logged += h.groups[g].appended - h.groups[g].covered
		changed += h.groups[g].changed()
	}
	h.mu.Unlock()
	n := 0
	for g := range h.cfg.Groups {
		h.mu.Lock()
		gs := &h.groups[g]
		skip := !gs.ready || (gs.dispatched <= gs.checkpoint && len(gs.dirty) == 0 && len(gs.spills) == 0)
		h.mu.Unlock()
		if !skip {
			n++
			groups.Go(func() error { return h.checkpointGroup(ctx, g, pace) })
		}
	}
	err := groups.Wait()
	// delivered and changed are what checkpointDue weighed: the keys'
	// deliveries since the last round began, and the keys changed since.
	h.log.Debug("checkpoint", "why", why, "groups", n, "log_bytes", logged, "delivered", delivered, "changed", changed, "paced", pace != nil, "took", time.Since(begin), "err", err)
	return err
}

// indexIDHold is how long checkpoints keep storing ids in the id index
// after a key last left memory for want of room (indexIDs).
const indexIDHold = 10 * time.Minute

// indexIDs reports whether a checkpoint round beginning at now stores the
// ids its snapshots hand over in the store's id index, and writes them
// into the snapshots as fingerprints (fold.SnapshotOptions.IDIndex): with
// Config.AlwaysIndexIDs, or while keys leave memory for want of room (one
// did within indexIDHold). The index pays for itself only where keys leave
// memory: a key's state in the snapshot cache, the spill or the store is
// smaller with fingerprints. Where every key fits, it bought nothing until
// a restart and cost its writes and their compactions, more than a third
// of the embedded store's throughput at 10k keys (BENCHMARKS.md, session
// 40). Either way the snapshots are exact: an id written in full needs no
// index, one written as a fingerprint is in it (the ids a state hands
// over are those after the last it handed over).
func (h *Host) indexIDs(now time.Time) bool {
	if !h.idIndex {
		return false
	}
	if h.cfg.AlwaysIndexIDs {
		return true
	}
	h.indexMu.Lock()
	defer h.indexMu.Unlock()
	if h.leftMemory.Swap(0) > 0 {
		h.indexUntil = now.Add(indexIDHold)
	}
	return now.Before(h.indexUntil)
}

// keyLeftMemory counts a key that left memory for want of room: into the
// snapshot cache or the spill, or out (no resident tier). See indexIDs.
func (h *Host) keyLeftMemory() { h.leftMemory.Add(1) }

// A checkpoint round at a million keys snapshots a few hundred thousand
// keys; as fast as it could, it took both cores for its seconds (with the
// store's flush of what it wrote), and the acks of the commits meanwhile
// waited for a CPU: at half load the ack tail was the rounds' (BENCHMARKS.md,
// sessions 30 and 38). A round of the loop is paced instead: its snapshots
// at a rate that spreads them over paceShare of the time since the last
// round began, the time the next one is likely to come after. Rounds of
// fewer than minPacedKeys changed keys are not paced.
const (
	paceShare    = 0.5
	minPacedKeys = 4 * snapshotChunk
)

// pacer is a checkpoint round's pace: a rate of snapshots, until hurried.
type pacer struct {
	rate    *rate.Limiter
	hurried chan struct{} // closed by hurry
	once    sync.Once
}

// hurry lifts the pace: the round's waits end, and it waits no more.
func (p *pacer) hurry() { p.once.Do(func() { close(p.hurried) }) }

// paceWait waits until the pace p allows n more snapshots (nil: at once);
// it ends early if the host fails.
func (h *Host) paceWait(ctx context.Context, p *pacer, n int) error {
	for p != nil && n > 0 {
		k := min(n, p.rate.Burst())
		n -= k
		r := p.rate.ReserveN(time.Now(), k)
		d := r.Delay()
		if d == 0 {
			continue
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-p.hurried:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			r.Cancel()
			return ctx.Err()
		case <-h.failCh:
			t.Stop()
			return h.Err()
		}
	}
	return nil
}

// hurryCheckpoint lifts the pace of the round under way, if any: the
// memory budget is full of changed keys that only a checkpoint frees; the
// log above the checkpoints (what the round covers and what was logged
// since it began) reached CheckpointMaxBytes, the replay bound; or groups
// are being released, whose checkpoints wait for the round's.
func (h *Host) hurryCheckpoint() {
	if p := h.pacing.Load(); p != nil {
		p.hurry()
	}
}

// roundPace returns the pace of a loop's checkpoint round beginning at
// begin (nil: unpaced), and records its beginning.
func (h *Host) roundPace(begin time.Time) *pacer {
	last := h.lastRound
	h.lastRound = begin
	changed := 0
	h.mu.Lock()
	for i := range h.groups {
		changed += h.groups[i].changed()
	}
	full := h.resident.needsCheckpoint()
	h.mu.Unlock()
	if last.IsZero() || changed < minPacedKeys || full {
		return nil
	}
	spread := paceShare * begin.Sub(last).Seconds()
	return &pacer{rate: rate.NewLimiter(rate.Limit(float64(changed)/spread), snapshotChunk), hurried: make(chan struct{})}
}

// Snapshots are asked for a chunk of keys at a time (snapshotChunk), by a
// few groups at a time (Host.snapshotting). Asked all at once, the keys of
// a checkpoint flooded the actors' workers: at a million keys a checkpoint
// queued a few hundred thousand snapshot runs (beyond the dispatcher's
// queue each got a goroutine of its own) ahead of the inputs of every
// commit after it, and acks waited seconds behind them (BENCHMARKS.md,
// session 10). Now at most snapshotChunk*snapshotParallelism snapshots are
// queued ahead of an input, well within the workers' queue.
const (
	snapshotChunk       = 256
	snapshotParallelism = 4
	// directPerLock bounds the active keys a checkpoint snapshots itself
	// (snapshotKeys) in one hold of h.mu: at ten thousand keys each
	// encodes a part of up to 32 remembered ids (fold.PartIDs).
	directPerLock = 16
)

// written is what a key is told once its snapshot is stored.
type written struct {
	g       *grain
	pos     persistence.Position
	version uint64
}

// checkpointGroup checkpoints one group: it asks the keys that were dirty
// as of the group's last dispatched record for their snapshots, writes them
// and trims the group's log through that record. A key is asked after it
// was sent every record up to there (under h.mu), so its snapshot reflects
// them and the trim loses nothing; a key changed again meanwhile snapshots
// the later records too, and stays dirty if it changed after it was asked.
//
// A group's checkpoints run one at a time (the loop's and a release's could
// otherwise overlap): the stores write every snapshot they are given, even
// below their checkpoint, so an older checkpoint landing after a newer one
// would put back older snapshots over a log already trimmed above them,
// losing what came between (TestOverlappingCheckpointsOfAGroupKeepTheNewer).
// So a release waits for a checkpoint of its group already under way (its
// snapshot replies, and its store calls within storeTimeout), whatever its
// own ctx says.
func (h *Host) checkpointGroup(ctx context.Context, g uint32, pace *pacer) error {
	h.checkpointing[g].Lock()
	defer h.checkpointing[g].Unlock()
	h.mu.Lock()
	gs := &h.groups[g]
	if !gs.ready {
		h.mu.Unlock()
		return nil
	}
	through, epoch, filter := gs.dispatched, gs.epoch, gs.stored
	at := max(through, gs.checkpoint) // the group's position once stored
	covers := gs.appended             // the bytes of log through covers
	var clock []byte                  // the group's clocks as of through
	if len(gs.clocks) > 0 {
		gc := &keyfoldv1.GroupClock{}
		for _, w := range gs.clocks {
			gc.Pipelines = append(gc.Pipelines, w)
		}
		slices.SortFunc(gc.Pipelines, func(a, b *keyfoldv1.Watermark) int { return strings.Compare(a.Pipeline, b.Pipeline) })
		var err error
		if clock, err = proto.Marshal(gc); err != nil { // cannot happen
			h.mu.Unlock()
			return fmt.Errorf("actors: checkpoint group %d: encode clock: %w", g, err)
		}
	}
	dirty := slices.Clone(gs.dirty)
	spilled := h.freezeSpillLocked(g)
	dropIDs := h.idDropBucket(gs.nowMs, gs.idsDropped)
	// The lists are sized as the group's last round filled them a key:
	// grown by append, the ids' alone were a tenth of the bytes the node
	// allocated at a million keys (BENCHMARKS.md, session 49).
	keys := gs.changed()
	d := checkpointData{CheckpointData: persistence.CheckpointData{Snapshots: make([]persistence.Snapshot, 0, gs.lastRound.capFor(keys, gs.lastRound.snapshots)+1), Through: through}}
	if h.indexing.Load() {
		d.IDs = make([]persistence.StoredID, 0, gs.lastRound.capFor(keys, max(gs.lastRound.ids, gs.lastRound.keys)))
	}
	h.mu.Unlock()
	stored := false
	if len(spilled) > 0 {
		defer func() {
			if stored {
				return
			}
			h.mu.Lock()
			if gs.epoch == epoch {
				h.thawSpillLocked(g, spilled) // the next checkpoint writes them
			}
			h.mu.Unlock()
		}()
	}

	if h.afterFreeze != nil {
		h.afterFreeze(g)
	}
	if clock != nil {
		d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: groupClockKey, Data: clock})
	}
	got, moved, fromSpill, err := h.snapshotKeys(ctx, g, epoch, dirty, spilled, &d, pace)
	if errors.Is(err, errDropped) {
		return nil // lost meanwhile: its keys are gone, its next take-over replays its log
	}
	if errors.Is(err, errSpillBroken) {
		// (Not expected: the spill holds what it encoded.) Its keys are
		// only there and in the log: the group's take-over replays them.
		h.lose(g, epoch, err)
		return fmt.Errorf("actors: checkpoint group %d: %w", g, err)
	}
	if err != nil {
		return fmt.Errorf("actors: checkpoint group %d: %w", g, err)
	}
	// The keys handed their results to the output queue before replying:
	// they must be stored before the log they came from is trimmed.
	if err := h.flushOutputs(ctx); err != nil {
		return fmt.Errorf("actors: checkpoint group %d: %w", g, err)
	}
	d.DropIDsBefore = dropIDs
	// The keys written join the group's filter before they are (and its
	// changed layers are written with them): storedkeys.go.
	d.addShapes()
	layers := filter.addWritten(&d.CheckpointData, at)
	wctx, cancel := context.WithTimeout(ctx, storeTimeout)
	err = h.store.Checkpoint(wctx, g, epoch, d.CheckpointData)
	cancel()
	if errors.Is(err, persistence.ErrFenced) {
		// Another owner claimed the group: it is theirs to checkpoint (and
		// this host's to take over again, unless it is draining).
		h.lose(g, epoch, err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("actors: checkpoint group %d: %w", g, err)
	}
	stored = true
	filter.saved(layers)
	h.stats.checkpoints.Add(1)
	written := len(got) + len(moved) + fromSpill // (moved grows below)
	h.stats.snapshots.Add(int64(written))

	h.mu.Lock()
	defer h.mu.Unlock()
	if gs.epoch != epoch || !gs.ready {
		return nil // lost meanwhile: these keys are gone
	}
	for _, r := range got {
		if r.g.spilled {
			// It left memory into the spill after its reply: its entry is
			// what was written unless it came back and changed since.
			if e, ok := h.findSpilledLocked(r.g.id, g); ok && e.e.dirtyAt <= r.pos {
				moved = append(moved, spilledCopy{id: r.g.id, arena: e.a.id, off: e.off})
			}
			continue
		}
		// Told before the key turns clean and may leave memory. A dirty
		// key is in memory (active, stopping or parked) or spilled. (Told
		// without a message: a message each flooded the workers as the
		// snapshot requests did.)
		r.g.markSaved(r.version)
		if r.g.dirtyAt <= r.pos {
			h.cleanLocked(r.g)
		}
	}
	if through > gs.checkpoint {
		gs.checkpoint = through
	}
	gs.idsDropped = max(gs.idsDropped, dropIDs)
	gs.covered = max(gs.covered, covers)
	gs.lastRound = roundSize{keys: written, snapshots: len(d.Snapshots), ids: len(d.IDs)}
	h.retireSpillLocked(g, spilled) // its keys are stored: to the snapshot cache
	h.retireMovedLocked(g, moved)   // likewise, those written from the spill or that spilled since
	h.evictLocked()                 // the keys it cleaned may leave memory now
	return nil
}

// snapshotKeys adds to d the snapshots of the keys spilled when the
// checkpoint began (spilled, frozen) and asks keys of group g (in memory,
// dirty when it began) for theirs, a chunk at a time; it returns what each
// key is to be told once they are stored, and the keys written from the
// spill they went to meanwhile. A key no longer dirty is skipped. A parked
// key is snapshotted here, without an actor: meanwhile it is held as if
// stopping, so what is sent to it waits (resident.go); and it is parked
// again whatever happens. An active key whose actor is idle is snapshotted
// here too, under h.mu (nothing can reach its actor meanwhile); the others
// are asked through their actors. errDropped: the group was lost
// meanwhile.
func (h *Host) snapshotKeys(ctx context.Context, g uint32, epoch persistence.Epoch, keys []*grain, spilled []*spillArena, d *checkpointData, pace *pacer) (_ []written, _ []spilledCopy, fromSpill int, _ error) {
	select {
	case h.snapshotting <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, 0, ctx.Err()
	}
	defer func() { <-h.snapshotting }()
	fromSpill, err := h.snapshotSpilled(spilled, d)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%w: %w", errSpillBroken, err)
	}
	if err := h.paceWait(ctx, pace, fromSpill); err != nil {
		return nil, nil, 0, err
	}
	got := make([]written, 0, len(keys))
	add := func(r snapshotReply) error {
		if r.err != nil {
			return r.err
		}
		appendSnapshot(d, &r)
		got = append(got, written{r.g, r.pos, r.version})
		return nil
	}
	replies := make(chan snapshotReply, snapshotChunk)
	var (
		parked []*grain
		moved  []spilledCopy // all of them
	)
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), snapshotChunk)]
		keys = keys[len(chunk):]
		if err := h.paceWait(ctx, pace, len(chunk)); err != nil {
			return nil, nil, 0, err
		}
		parked = parked[:0]
		movedNow := len(moved)
		asked := 0
		h.mu.Lock()
		gs := &h.groups[g]
		err := chunkErrLocked(gs, epoch, chunk)
		direct := 0 // snapshotted here since h.mu was taken
		for i := 0; err == nil && i < len(chunk); i++ {
			if direct == directPerLock {
				// h.mu is also what commits wait for: let them in between.
				h.mu.Unlock()
				h.mu.Lock()
				direct = 0
				if err = chunkErrLocked(gs, epoch, chunk[i:]); err != nil {
					break
				}
			}
			k := chunk[i]
			if k.spilled {
				// It left memory into the spill since the checkpoint
				// began: it is written from where it is now, its grain
				// if it came back (dirty: only a checkpoint of its group
				// cleans it), else its entry.
				if now := h.lookupLocked(k.id, g); now != nil {
					k = now
				} else if at, ok := h.findSpilledLocked(k.id, g); ok {
					moved = append(moved, spilledCopy{k.id, slices.Clone(at.e.value), at.e.lastNow, at.a.id, at.off})
					continue
				} else {
					err = fmt.Errorf("actors: changed key %s/%s left the spill unsaved", k.id.pipeline, k.id.key)
					break
				}
			}
			switch {
			case k.dirtyIdx == 0:
				continue // stored since
			case k.tier == tierParked:
				h.unparkLocked(k)
				h.holdLocked(k)
				parked = append(parked, k)
			case k.tier == tierActive && !k.pipeline.HasHandler() && k.sh.mb.idle():
				// Its actor is done with it and nothing is on its way
				// (what is sent to a key is sent under h.mu): snapshotted
				// here, as a parked key is, instead of through a message,
				// a mailbox run and a reply (BENCHMARKS.md, session 30).
				// (Not a Go handler's key: its codec is the user's code,
				// kept from under h.mu.)
				err = add(k.heldSnapshot())
				direct++
			case k.tier == tierActive:
				// Not a use of the key: its place in the order of use
				// stays (deliverLocked would mark it used).
				k.sh.send(&snapshotMsg{reply: replies})
				asked++
			default: // stopping: it waits for the next actor, or the park
				h.deliverLocked(k, &snapshotMsg{reply: replies})
				asked++
			}
		}
		h.mu.Unlock()
		for i := movedNow; err == nil && i < len(moved); i++ {
			if e := h.snapshotEntry(moved[i].id, moved[i].value, moved[i].lastNow, d); e != nil {
				err = fmt.Errorf("%w: %w", errSpillBroken, e)
			}
		}
		for _, pg := range parked {
			if err == nil {
				err = add(pg.heldSnapshot())
			}
		}
		if len(parked) > 0 {
			// Back, also after an error (held, what is sent to them would
			// wait for good), or to a new actor if inputs waited.
			h.mu.Lock()
			for _, pg := range parked {
				h.parkLocked(pg)
			}
			h.mu.Unlock()
		}
		if err != nil {
			return nil, nil, 0, err
		}
		for range asked {
			select {
			case r := <-replies:
				if err := add(r); err != nil {
					return nil, nil, 0, err
				}
			case <-ctx.Done():
				return nil, nil, 0, ctx.Err()
			case <-h.failCh:
				return nil, nil, 0, h.Err()
			}
		}
	}
	return got, moved, fromSpill, nil
}

// spilledCopy is a copy of a spilled key's entry, and where it is.
type spilledCopy struct {
	id         keyID
	value      []byte
	lastNow    int64
	arena, off uint32
}

// checkpointData is a checkpoint's data as it is gathered, and the memory
// its snapshots' names are made in.
type checkpointData struct {
	persistence.CheckpointData
	names []byte // the names' bytes; only ever appended to
	// shapes are the pipelines with a snapshot in the packed form among
	// the snapshots: their shapes are written with them (addShapes).
	shapes []*fold.Pipeline
}

// addShapes adds to d the shape of each pipeline a packed snapshot in it
// was written with: the snapshot is read by name through it once the
// pipeline's aggregates change (packed.go). A few dozen bytes per pipeline
// and checkpoint, written again by each, so that no group's snapshot ever
// names a shape its group does not hold, whoever wrote the group before.
func (d *checkpointData) addShapes() {
	for _, p := range d.shapes {
		shape, id := p.Shape()
		d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: shapeKey(p.Name(), id), Data: shape})
	}
}

// name returns the key's name in the snapshot store (keyID.snapshotKey),
// made in d.names: a checkpoint names every key it writes, nearly one per
// event at a million keys, and a string each was 1% of the CPU there.
func (d *checkpointData) name(id keyID) string {
	n := len(id.pipeline) + 1 + len(id.key)
	if cap(d.names)-len(d.names) < n {
		d.names = make([]byte, 0, max(n, nameChunk))
	}
	start := len(d.names)
	d.names = id.appendSnapshotKey(d.names)
	// The bytes are never written again: a name is appended after them,
	// or to a new chunk.
	return unsafe.String(&d.names[start], n)
}

// nameChunk is the size of checkpointData's chunks of names.
const nameChunk = 16 << 10

// idExpiryGrace is how long after the dedup window the store may forget an
// id by itself (a Redis store expires a bucket of the id index after its
// ids' latest StoredID.Expires). The index drops what passed the window by
// the group's clock (idDropBucket); the expiry only bounds what a group
// that gets no more events keeps. A log replayed that long after it was
// written would find ids it might need gone: a week covers any outage a
// node is restarted from.
const idExpiryGrace = 7 * 24 * time.Hour

// idDropBucket returns the bucket of the store's id index below which a
// group's checkpoint drops the ids (persistence.CheckpointData.
// DropIDsBefore), given the group's clock (the latest processing time of
// the records handed to its keys) and the bucket it dropped below last; 0
// if nothing more may go.
//
// Every key's clock is at most the group's, and a record after the
// checkpoint applies at the group's clock or later (processing time is
// the node's clock at commit): an id in a dropped bucket has expired for
// every key that applies a record after it, replayed or not, so what the
// index no longer holds is what a key would have expired anyway, and
// replay decides as the first run did. The margin (a sixteenth of the
// window and ten minutes) covers a node's clock stepping back, or another
// node's being behind, after a take-over.
func (h *Host) idDropBucket(groupNow int64, dropped int64) int64 {
	if !h.idIndex || groupNow <= 0 {
		return 0
	}
	var window time.Duration
	for _, p := range h.cfg.Pipelines {
		window = max(window, p.DedupWindow())
	}
	b := fold.IndexBucket(groupNow - (window + window/16 + 10*time.Minute).Milliseconds())
	if b <= dropped {
		return 0
	}
	return b
}

// roundSize is what a group's checkpoint wrote: its keys, snapshots (the
// keys' cores, their stored parts and the group's clock) and ids.
type roundSize struct{ keys, snapshots, ids int }

// capFor returns a capacity for the entries of a checkpoint of keys keys,
// of which the round r wrote n for r.keys: as many a key, and a sixteenth
// more, since most rounds' keys take about as many events as the last's.
// It is at most twice n and an entry a key (a round of a few keys with
// many entries each does not size the next for thousands of keys alike),
// and before a first round an entry a key.
func (r roundSize) capFor(keys, n int) int {
	if r.keys == 0 {
		return keys
	}
	return min(keys*n*17/(16*r.keys)+1, 2*n+keys)
}

// appendSnapshot adds a key's snapshot to a checkpoint's data.
func appendSnapshot(d *checkpointData, r *snapshotReply) {
	r.core.Key = d.name(r.g.id)
	d.Snapshots = append(d.Snapshots, r.core)
	if r.packed && !slices.Contains(d.shapes, r.g.pipeline) {
		d.shapes = append(d.shapes, r.g.pipeline)
	}
	d.Snapshots = append(d.Snapshots, r.buckets...)
	if len(r.ids) > 0 {
		grace := (r.g.pipeline.DedupWindow() + idExpiryGrace).Milliseconds()
		for _, id := range r.ids {
			d.IDs = append(d.IDs, persistence.StoredID{Bucket: fold.IndexBucket(id.At), Key: r.core.Key, ID: id.ID, At: id.At, Expires: id.At + grace})
		}
	}
	if r.ttl {
		d.Timers = append(d.Timers, persistence.Timer{Key: r.core.Key + expirySuffix, Due: r.expiry})
	}
	if r.timed {
		d.Timers = append(d.Timers, persistence.Timer{Key: r.core.Key, Due: r.due})
	}
}

// chunkErrLocked reports why a checkpoint of group gs, in epoch, cannot go
// on with keys: the group was dropped (errDropped), or one of them left
// memory unsaved. h.mu must be held.
func chunkErrLocked(gs *groupState, epoch persistence.Epoch, keys []*grain) error {
	if !gs.ready || gs.epoch != epoch {
		return errDropped
	}
	return goneDirty(keys)
}

// goneDirty fails if a dirty key left memory. That happens only to a key
// whose activation failed (broken: its group is being lost), as a dirty key
// leaves memory only with its group: its changes are only in the log,
// which must stay. h.mu must be held.
func goneDirty(keys []*grain) error {
	for _, k := range keys {
		if k.dirtyIdx != 0 && k.tier == tierGone {
			if k.broken != nil {
				return k.broken
			}
			return fmt.Errorf("actors: changed key %s/%s left memory unsaved", k.id.pipeline, k.id.key)
		}
	}
	return nil
}

// passivateLoop passivates keys beyond MaxActive when nudged, and idle ones
// every CheckpointInterval, until ctx ends or the host fails.
func (h *Host) passivateLoop(ctx context.Context) {
	ticker := time.NewTicker(h.cfg.CheckpointInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.failCh:
			return
		case <-ticker.C:
		case <-h.passivateNow:
		}
		h.passivate()
	}
}

// passivate stops grains idle past IdleTimeout and, while more than
// MaxActive grains are active, those least recently used, into the
// resident tier (dirty ones too: a checkpoint snapshots them there). It
// walks the grains from the least recently used end of the order of use.
//
// That order is kept lazily: a key sent to while active is marked used
// (deliverLocked), not moved, and the walk moves a marked key it meets to
// the front, unmarked, instead of passivating it (a second chance, as the
// CLOCK algorithm gives). Moving every key at every event read both of its
// neighbours, two cache misses of the commit loop's per event once the
// grains outnumber the CPU's caches (BENCHMARKS.md, session 34). So the
// walk passivates, of the keys used since they took their place and those
// not, the second first: a key activated and not used since goes before
// one used again, even one used earlier. And a key moved up long after
// its last use is found idle only once the unmarked keys behind it were:
// up to IdleTimeout late.
//
// A walk visits each active key at most twice (once to move it up, once
// more), and holds h.mu, which commits wait for, for passivateBatch keys
// at a time: after an idle hour every key a busy node used since the last
// tick is marked, and one hold for all of them would stall the commits.
func (h *Host) passivate() {
	idleBefore := time.Now().Add(-h.cfg.IdleTimeout).UnixNano()
	h.mu.Lock()
	visits := 2 * h.lru.n
	h.mu.Unlock()
	for visits > 0 {
		h.mu.Lock()
		done := h.passivateSomeLocked(idleBefore, min(visits, passivateBatch))
		h.mu.Unlock()
		if done {
			return
		}
		visits -= passivateBatch
	}
}

// passivateBatch bounds the keys passivate visits in one hold of h.mu.
const passivateBatch = 256

// passivateSomeLocked goes on with passivate's walk, from the least
// recently used end, for at most n keys, and reports whether it is done:
// it met a key neither marked, idle nor in excess, or the end. h.mu must
// be held.
func (h *Host) passivateSomeLocked(idleBefore int64, n int) (done bool) {
	excess := h.lru.n - h.cfg.MaxActive
	for g := h.lru.back(); g != nil; n-- {
		if n == 0 {
			return false
		}
		prev := h.grains.prev(g)
		if g.used {
			g.used = false
			h.lru.touch(g)
			g = prev
			continue
		}
		if g.lastUsed >= idleBefore && excess <= 0 {
			return true
		}
		h.stopLocked(g)
		excess--
		g = prev
	}
	return true
}

// stopLocked passivates a grain into the resident tier. passivateMsg is
// processed after every message already in its actor's mailbox, and
// nothing of the key is sent to that actor after it: the key stops being
// active, and forgets the actor, under h.mu (shell.go). An actor whose
// mailbox is idle is done with the grain already (the usual case: the
// least recently used keys are passivated), so the grain parks and the
// shell returns to the pool here, without the message: a message, a
// mailbox run on a worker and a second hold of h.mu less per activation at
// a million keys (BENCHMARKS.md, session 17). Nothing can reach the mailbox
// meanwhile: the host sends a key's messages under h.mu.
func (h *Host) stopLocked(g *grain) {
	s := g.sh
	h.deactivateLocked(g)
	h.holdLocked(g) // it parks once its actor is done with it (resident.go)
	h.stats.passivated.Add(1)
	if s.mb.idle() {
		h.stats.parkedIdle.Add(1)
		h.handBackLocked(s, g)
		return
	}
	s.send(&passivateMsg{})
}
