package actors

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
)

// A key group is served only while the host owns it in the store and its
// keys' memory matches its log. Recover takes every group over at start;
// afterwards a group whose append failed (the outcome is unknown), whose
// write was fenced by another owner, or one of whose keys could not load its
// snapshot is lost: its grains are dropped, its calls answer ErrUnavailable,
// and the take-over loop claims it again and replays its log, retrying with
// backoff while the store is down.

// errTakeOverRunning is the failure of a take-over of a group whose take-over
// is already running; it is retried like any other.
var errTakeOverRunning = errors.New("its take-over is already running")

// errCorrupt marks a log record that does not decode: replaying cannot get
// past it, so retrying is pointless.
var errCorrupt = errors.New("corrupt log record")

// takeOverParallelism bounds the groups claimed and replayed at once. Claims
// are synced writes that the store batches when they run concurrently (256
// groups: 15 ms concurrently against 700 ms one by one, embedded store).
const takeOverParallelism = 32

// fencedBackoff is about how long a host waits before claiming back groups
// another owner claimed (jittered by ±50%).
const fencedBackoff = 100 * time.Millisecond

// Backoff between rounds of take-over attempts while the store fails.
const (
	minRetakeBackoff = 50 * time.Millisecond
	maxRetakeBackoff = 5 * time.Second
)

// Recover checks the store and takes every key group over: it claims each,
// which fences off any earlier owner, and replays each group's log above its
// checkpoint into its keys. Store errors are retried with backoff (logged)
// until ctx ends, so a node started while its store is unreachable becomes
// ready when the store returns. Call it once, before Run. If it fails the
// host is unusable and has released its actors.
func (h *Host) Recover(ctx context.Context) error {
	err := h.recover(ctx)
	if err != nil {
		h.stopAll()
	}
	return err
}

func (h *Host) recover(ctx context.Context) error {
	start := time.Now()
	backoff := minRetakeBackoff
	for {
		stored, err := h.store.CheckGroups(ctx, h.cfg.Groups, uint32(LayoutKey))
		if err == nil {
			if err := h.setLayout(storedLayout(stored)); err != nil {
				return fmt.Errorf("actors: recover: %w", err)
			}
			// (Known once the store's format is: CheckGroups.)
			h.packed = persistence.AllowsPacked(h.store)
			if !h.packed {
				h.log.Info("the store's format does not allow packed snapshots: snapshots are stored as messages, about three times the bytes (a store created by this version allows them)")
			}
			if h.idIndex = persistence.HasIDIndex(h.store); !h.idIndex {
				h.log.Info("the store's format has no id index: snapshots keep the ids keys remember in full, rewritten with each snapshot of a key (a store created by this version has one)")
			}
			break
		}
		if errors.Is(err, persistence.ErrGroupsMismatch) || errors.Is(err, persistence.ErrIncompatible) || ctx.Err() != nil {
			return fmt.Errorf("actors: recover: %w", err)
		}
		h.log.Warn("store unavailable; retrying", "err", err, "in", backoff)
		if !sleep(ctx, backoff) {
			return fmt.Errorf("actors: recover: %w", err)
		}
		backoff = min(2*backoff, maxRetakeBackoff)
	}
	all := h.cfg.Owned
	if all == nil {
		all = make([]uint32, h.cfg.Groups)
		for g := range all {
			all[g] = uint32(g)
		}
	}
	h.mu.Lock()
	for _, g := range all {
		h.groups[g].owned = true
	}
	h.mu.Unlock()
	if err := h.takeOverUntilDone(ctx, all); err != nil {
		return fmt.Errorf("actors: recover: %w", err)
	}
	h.log.Info("recovered", "groups", len(all), "records", h.stats.replayed.Load(),
		"keys", h.Stats().ActiveKeys, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// setLayout takes the store's key-group layout, refusing one this host
// cannot serve: a layout it does not know, or joins on LayoutPipelineKey.
func (h *Host) setLayout(l Layout) error {
	switch l {
	case LayoutKey:
	case LayoutPipelineKey:
		for _, name := range slices.Sorted(maps.Keys(h.cfg.Pipelines)) {
			if h.cfg.Pipelines[name].IsJoin() {
				return fmt.Errorf("%w: join %q needs both sides of a key in one key group, and this store was created "+
					"before keyfold laid keys out so (layout %v): its keys of pipelines %q and %q are in different groups. "+
					"Start the joins on a new store (another data dir, or another redis_prefix) and send the events there, "+
					"or remove the joins to go on with this one", ErrLayout, name, l, h.cfg.Pipelines[name].JoinSides()[0], h.cfg.Pipelines[name].JoinSides()[1])
			}
		}
	default:
		return fmt.Errorf("%w: the store's key-group layout is %v, which this build does not know (a newer build created it)", persistence.ErrIncompatible, l)
	}
	h.layout.Store(uint32(l))
	return nil
}

// takeOverLoop retakes lost groups until ctx ends. It fails the host only
// on an error that retrying cannot fix.
func (h *Host) takeOverLoop(ctx context.Context) {
	for await(h, ctx, h.lostNow) {
		h.mu.Lock()
		var lost []uint32
		fenced := false
		for g := range h.groups {
			if gs := &h.groups[g]; !gs.ready && gs.owned {
				lost = append(lost, uint32(g))
				fenced = fenced || errors.Is(gs.lastErr, persistence.ErrFenced)
			}
		}
		h.mu.Unlock()
		if len(lost) == 0 {
			h.storeDown.Store(false) // nothing left to claim that could clear it
			continue
		}
		if fenced {
			// Another owner claimed these groups. Claiming them straight
			// back would fence it in turn before it could write: give it a
			// moment, so that two owners (a misconfiguration, or a
			// rebalance in flight) alternate instead of livelocking.
			if !sleep(ctx, fencedBackoff/2+rand.N(fencedBackoff)) {
				return
			}
		}
		h.log.Info("taking key groups over again", "groups", len(lost), "list", GroupList(lost))
		start := time.Now()
		if err := h.takeOverUntilDone(ctx, lost); err != nil {
			if ctx.Err() == nil {
				h.fail(err)
			}
			return
		}
		h.log.Info("key groups taken over again", "groups", len(lost), "took", time.Since(start).Round(time.Millisecond))
	}
}

// takeOverUntilDone takes the groups over, retrying the failed ones with
// backoff, until all are served, ctx ends, or an error that retrying cannot
// fix.
func (h *Host) takeOverUntilDone(ctx context.Context, groups []uint32) error {
	backoff := minRetakeBackoff
	for {
		failed := make([]bool, len(groups))
		var eg errgroup.Group
		eg.SetLimit(takeOverParallelism)
		var firstErr error
		for i, g := range groups {
			eg.Go(func() error {
				err := h.takeOver(ctx, g)
				if err == nil {
					return nil
				}
				if errors.Is(err, errCorrupt) {
					return err
				}
				failed[i] = true
				return nil
			})
		}
		if err := eg.Wait(); err != nil {
			return err
		}
		var rest []uint32
		for i, g := range groups {
			if failed[i] {
				rest = append(rest, g)
			}
		}
		if len(rest) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h.mu.Lock()
		firstErr = h.groups[rest[0]].lastErr
		h.mu.Unlock()
		h.log.Warn("cannot take key groups over; retrying", "groups", len(rest), "err", firstErr, "in", backoff)
		if !sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, maxRetakeBackoff)
		groups = rest
	}
}

// takeOver claims one group and replays its log. On failure the group's
// grains are dropped again and the error is kept in the group's state.
func (h *Host) takeOver(ctx context.Context, g uint32) error {
	h.mu.Lock()
	switch gs := &h.groups[g]; {
	case !gs.owned, gs.ready:
		h.mu.Unlock()
		return nil // released meanwhile (the new owner takes it over), or served
	case gs.takingOver:
		// Another take-over of it is running (the take-over loop and
		// SetOwned): two would claim in turn and drop each other's replay.
		h.mu.Unlock()
		return errTakeOverRunning
	default:
		gs.takingOver = true
	}
	h.mu.Unlock()
	st, err := h.store.Claim(ctx, g)
	if err == nil {
		h.storeDown.Store(false)
		h.mu.Lock()
		gs := &h.groups[g]
		gs.epoch, gs.checkpoint, gs.dispatched, gs.spoiled = st.Epoch, st.Checkpoint, st.Checkpoint, nil
		gs.replaying = true
		gs.appended, gs.covered = 0, 0 // what the replay reads counts again
		// Never checkpointed: no key of it has a snapshot (a checkpoint
		// writes snapshots and advances its position in one write).
		gs.complete = st.Checkpoint == 0
		gs.clocks, gs.timers, gs.expiry = nil, nil, nil
		gs.stored = nil
		h.mu.Unlock()
		if !h.noStoredKeys {
			err = h.loadStoredKeys(ctx, g, st)
		}
		if err == nil && (h.timed || h.expiring) {
			err = h.loadTimers(ctx, g, st.Epoch)
		}
		if err == nil {
			err = h.replayLog(ctx, g, st.Checkpoint)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	gs := &h.groups[g]
	gs.takingOver, gs.replaying = false, false
	if err == nil && gs.spoiled != nil { // a key could not load its snapshot
		err = gs.spoiled
	}
	if err == nil && !gs.owned { // released while it was being taken over
		h.dropGroupsLocked(map[uint32]bool{g: true})
		return nil
	}
	if err != nil {
		err = fmt.Errorf("take over group %d: %w", g, err)
		gs.lastErr = err
		h.dropGroupsLocked(map[uint32]bool{g: true})
		return err
	}
	gs.ready, gs.lastErr = true, nil
	// The group's clocks resume from where their watermarks stood, but not
	// their idleness: the time the node (or the group's previous owner) was
	// down is not time the source was quiet, or events that producers resend
	// after an outage would be late.
	now := h.cfg.Now().UnixMilli()
	for name := range gs.clocks {
		if c := h.clocks[name]; c != nil {
			h.cfg.Pipelines[name].Resume(c, now)
		}
	}
	return nil
}

// loadStoredKeys reads the filter of group g's stored keys, for the
// incarnation st claimed. A filter that does not decode is reported and
// left out: the group's keys are read as if it had none.
func (h *Host) loadStoredKeys(ctx context.Context, g uint32, st persistence.GroupState) error {
	f, err := loadStoredKeys(ctx, h.store, g, st.Checkpoint)
	switch {
	case errors.Is(err, errStaleFilter):
		h.log.Warn("the group's filter of stored keys is out of date; its keys are read from the store", "group", g, "err", err)
		f, err = nil, nil
	case errors.Is(err, errFilter):
		h.log.Error("the group's filter of stored keys is unreadable; its keys are read from the store", "group", g, "err", err)
		f, err = nil, nil
	}
	if err != nil {
		return err
	}
	h.mu.Lock()
	if gs := &h.groups[g]; gs.epoch == st.Epoch {
		gs.stored = f
	}
	h.mu.Unlock()
	return nil
}

// loadTimers reads a group's clocks as of its checkpoint and its timer
// index, for the group's incarnation epoch.
func (h *Host) loadTimers(ctx context.Context, g uint32, epoch persistence.Epoch) error {
	var gc keyfoldv1.GroupClock
	data, err := h.store.Get(ctx, g, groupClockKey)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
	case err != nil:
		return err
	default:
		if err := proto.Unmarshal(data, &gc); err != nil {
			return fmt.Errorf("group %d clock does not decode: %w: %w", g, errCorrupt, err)
		}
	}
	type entry struct {
		id     keyID
		due    int64
		expiry bool
	}
	var entries []entry
	err = h.store.Timers(ctx, g, func(key string, due int64) error {
		if id, expiry, ok := parseTimerKey(key); ok {
			if p := h.cfg.Pipelines[id.pipeline]; p != nil && (expiry && p.WakesByClock() || !expiry && p.Timed()) {
				entries = append(entries, entry{id, due, expiry})
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	gs := &h.groups[g]
	if gs.epoch != epoch {
		return fmt.Errorf("group %d was claimed again meanwhile", g)
	}
	for _, w := range gc.Pipelines {
		h.loggedClockLocked(g, w)
	}
	for _, e := range entries {
		indexes := &gs.timers
		if e.expiry {
			indexes = &gs.expiry
		}
		indexLocked(indexes, e.id.pipeline).set(e.id.key, e.due)
	}
	return nil
}

// lose marks a group lost after an error of its incarnation epoch, drops
// its grains and wakes the take-over loop. An error of an older incarnation
// changes nothing; one during a take-over makes the take-over retry.
func (h *Host) lose(g uint32, epoch persistence.Epoch, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loseLocked(map[uint32]persistence.Epoch{g: epoch}, err)
}

// loseLocked is lose for several groups, under h.mu.
func (h *Host) loseLocked(groups map[uint32]persistence.Epoch, err error) {
	drop := make(map[uint32]bool, len(groups))
	for g, epoch := range groups {
		gs := &h.groups[g]
		switch {
		case gs.epoch != epoch:
		case !gs.ready:
			gs.spoiled = err
		default:
			gs.ready, gs.lastErr = false, err
			drop[g] = true
		}
	}
	if len(drop) == 0 {
		return
	}
	lostList := slices.Sorted(maps.Keys(drop))
	var mine []uint32 // the groups this host is still to serve
	for _, g := range lostList {
		if h.groups[g].owned {
			mine = append(mine, g)
		}
	}
	if len(mine) > 0 {
		h.log.Warn("key groups lost; taking them over again", "groups", len(mine), "list", GroupList(mine), "err", err)
	}
	if len(mine) < len(lostList) {
		// Placement moved them away and their next owner claimed them
		// before this host had let go (a start or rebalance): expected.
		h.log.Info("key groups fenced by their next owner", "groups", len(lostList)-len(mine), "err", err)
	}
	h.stats.groupsLost.Add(int64(len(drop)))
	h.dropGroupsLocked(drop)
	select {
	case h.lostNow <- struct{}{}:
	default:
	}
}

// dropGroupsLocked stops the grains of the groups without writing their
// state: memory may no longer match the log, which a take-over replays. The
// messages already sent to them are still processed (passivateMsg comes
// after them), so the ingests they carry are answered; not held, the grains
// do not park (parkLocked).
func (h *Host) dropGroupsLocked(groups map[uint32]bool) {
	for k := h.lru.front(); k != nil; {
		next := h.grains.next(k)
		if groups[k.group] {
			k.sh.send(&passivateMsg{})
			h.deactivateLocked(k)
			h.forgetLocked(k)
		}
		k = next
	}
	for g := range groups {
		gs := &h.groups[g]
		h.dropParkedLocked(g)
		gs.complete = false
		for _, k := range gs.dirty {
			k.dirtyIdx, k.dirtyAt = 0, 0
		}
		gs.dirty = nil
		gs.appended, gs.covered = 0, 0
		gs.clocks, gs.timers, gs.expiry = nil, nil, nil // a take-over reads them again
		gs.stored = nil
	}
}

// await waits for c, the end of ctx or the host's failure, and reports
// whether c came first.
func await[T any](h *Host, ctx context.Context, c <-chan T) bool {
	select {
	case <-c:
		return true
	case <-ctx.Done():
	case <-h.failCh:
	}
	return false
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// A take-over replays its group's log a batch of records at a time: it
// decodes up to replayBatchRecords records (or replayBatchBytes of them),
// builds their messages, reads the snapshots of the keys those go to that
// are not in memory in one batched read (loadKeys), then hands the
// messages over. One read
// per key, inside each grain's activation, was most of a restart at a
// million keys: 12 s for 64 MiB of log naming 320k keys, two thirds of it
// in those reads (BENCHMARKS.md, session 22).
//
// Why the read is current when a grain starts from it: the group is being
// taken over, so nothing else changes its keys or their snapshots (only
// the replay sends inputs to them, and a checkpoint skips a group that is
// not served); a key read was in memory nowhere. A read is handed over at
// the key's first dispatch of the batch and then forgotten: by its next
// one the key may have left memory changed (passivation runs during a
// replay, and a changed key goes to the spill), and activated again it
// must start from there, not from the read.
const (
	replayBatchRecords = 256
	replayBatchBytes   = 1 << 20
)

// replayRecord is a logged record, decoded.
type replayRecord struct {
	pos  persistence.Position
	rec  *keyfoldv1.LogRecord
	size int // its bytes in the log
}

// replayLog replays group g's log after position after (see above).
func (h *Host) replayLog(ctx context.Context, g uint32, after persistence.Position) error {
	var (
		batch []replayRecord
		bytes int
	)
	flush := func() {
		h.replayBatch(ctx, g, batch)
		clear(batch)
		batch, bytes = batch[:0], 0
	}
	err := h.store.Read(ctx, g, after, func(pos persistence.Position, data []byte) error {
		h.stats.replayed.Add(1)
		rec, err := decodeRecord(data) // (copies what it keeps of data)
		if err != nil {
			return fmt.Errorf("actors: group %d record %d does not decode: %w: %w", g, pos, errCorrupt, err)
		}
		batch = append(batch, replayRecord{pos, rec, len(data)})
		if bytes += len(data); len(batch) >= replayBatchRecords || bytes >= replayBatchBytes {
			flush()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		flush()
	}
	return err
}

// replayBatch builds the messages of a batch of records, reads the
// snapshots of the keys they go to that are not in memory, then hands the
// messages over, a record at a time.
func (h *Host) replayBatch(ctx context.Context, g uint32, batch []replayRecord) {
	// The messages are built (the events prepared from their JSON again)
	// without h.mu: under it, the replays of groups taken over at once
	// ran one at a time.
	msgs := make([][]keyMsg, len(batch))
	for i, r := range batch {
		msgs[i] = h.replayMessages(g, r.pos, r.rec)
	}
	var ids []keyAt
	h.mu.Lock()
	epoch := h.groups[g].epoch
	seen := map[keyID]bool{}
	for _, ms := range msgs {
		for _, m := range ms {
			if !seen[m.id] {
				seen[m.id] = true
				if _, stored := h.mayBeStoredLocked(m.id, g); stored && h.groups[g].stored.mayHave(m.id) {
					ids = append(ids, keyAt{m.id, g})
				}
			}
		}
	}
	h.mu.Unlock()
	var read map[keyID]*loaded
	if len(ids) > 0 {
		// A failed read is not the replay's failure: each key then reads
		// for itself as it activates (and fails as it would).
		rctx, cancel := context.WithTimeout(ctx, storeTimeout)
		ls, err := loadKeys(rctx, h.store, h.cfg.Pipelines, ids)
		cancel()
		if err != nil {
			h.log.Warn("replay: batched snapshot read failed; the keys read for themselves", "group", g, "keys", len(ids), "err", err)
		} else {
			read = make(map[keyID]*loaded, len(ids))
			for i := range ls {
				read[ids[i].id] = &ls[i]
			}
		}
	}
	for i, r := range batch {
		h.mu.Lock()
		if h.groups[g].epoch != epoch {
			read = nil // (not expected during its take-over) the keys read for themselves
		}
		h.replayLocked(g, r, msgs[i], read)
		h.mu.Unlock()
	}
	// The replayed keys stay within MaxActive as ingested ones do. Before
	// Run (a start's recovery) no passivation loop runs, and a log naming
	// a million keys left them all active (an actor spawned for each, and
	// 1.5 GB) until Run's first passivation (BENCHMARKS.md, session 22).
	h.mu.Lock()
	over := h.lru.n > h.cfg.MaxActive
	h.mu.Unlock()
	if over {
		h.passivate()
	}
}

// takeRead returns a key's read state once (see replayBatchRecords).
func takeRead(read map[keyID]*loaded, id keyID) *loaded {
	l := read[id]
	delete(read, id)
	return l
}

// keyMsg is what a replayed record hands one key.
type keyMsg struct {
	id  keyID
	msg *applyMsg
}

// replayMessages builds what one logged record hands its keys. The
// record's inputs were accepted when logged, so they are applied whatever
// the configuration says now (see fold.Pipeline.Replay); only the inputs of
// a pipeline that was removed from the configuration are dropped, with a
// warning.
func (h *Host) replayMessages(g uint32, pos persistence.Position, rec *keyfoldv1.LogRecord) []keyMsg {
	var wms map[string]int64
	for _, w := range rec.Watermarks {
		if wms == nil {
			wms = make(map[string]int64, len(rec.Watermarks))
		}
		wms[w.Pipeline] = w.WatermarkMs
	}
	// A join's key may be listed (a timer of it was due) and take its
	// sides' events too: one message for all, sent after the record's.
	var joined map[keyID]*applyMsg
	var joinOrder []keyID
	joinMsg := func(id keyID) *applyMsg {
		m := joined[id]
		if m == nil {
			if joined == nil {
				joined = map[keyID]*applyMsg{}
			}
			m = &applyMsg{pos: pos, wm: wms[id.pipeline]}
			joined[id] = m
			joinOrder = append(joinOrder, id)
		}
		return m
	}
	msgs := make([]keyMsg, 0, len(rec.Keys))
	for _, ki := range rec.Keys {
		p := h.cfg.Pipelines[ki.Pipeline]
		if p == nil {
			h.log.Warn("discarding logged inputs of a pipeline no longer configured",
				"pipeline", ki.Pipeline, "key", ki.Key, "group", g, "seq", pos, "inputs", len(ki.Inputs))
			continue
		}
		if strings.ContainsRune(ki.Key, 0) { // cannot be logged today; would collide in the snapshot store
			h.log.Warn("discarding logged inputs of a key containing NUL", "pipeline", ki.Pipeline, "group", g, "seq", pos)
			continue
		}
		id := keyID{ki.Pipeline, ki.Key}
		msg := &applyMsg{pos: pos, wm: wms[ki.Pipeline]}
		if p.IsJoin() {
			msg = joinMsg(id)
		}
		for _, in := range ki.Inputs {
			if len(msg.segs) == 0 || msg.segs[len(msg.segs)-1].nowMs != in.IngestTimeMs {
				msg.segs = append(msg.segs, segment{nowMs: in.IngestTimeMs})
			}
			last := &msg.segs[len(msg.segs)-1]
			switch {
			case in.Erase:
				last.events = append(last.events, fold.Tombstone(ki.Key))
			case in.Expire:
				last.events = append(last.events, fold.ExpiryCheck(ki.Key))
			case in.Call:
				last.events = append(last.events, fold.ReplayCall(ki.Key, in.CallId, in.Event))
			default:
				last.events = append(last.events, p.Replay(in.Event, ki.Key))
			}
		}
		for _, j := range h.joins[ki.Pipeline] {
			for _, seg := range msg.segs {
				if evs := sideEvents(seg.events); len(evs) > 0 {
					jm := joinMsg(keyID{j.name, ki.Key})
					jm.segs = append(jm.segs, segment{nowMs: seg.nowMs, events: evs, side: j.side})
				}
			}
		}
		if !p.IsJoin() {
			msgs = append(msgs, keyMsg{id, msg})
		}
	}
	for _, id := range joinOrder {
		msgs = append(msgs, keyMsg{id, joined[id]})
	}
	return msgs
}

// replayLocked hands a replayed record's messages to their keys, those not
// in memory starting from their snapshots in read (see replayBatchRecords).
// h.mu must be held.
func (h *Host) replayLocked(g uint32, r replayRecord, msgs []keyMsg, read map[keyID]*loaded) {
	for _, w := range r.rec.Watermarks {
		h.loggedClockLocked(g, w)
	}
	for _, m := range msgs {
		for _, s := range m.msg.segs {
			h.groups[g].nowMs = max(h.groups[g].nowMs, s.nowMs)
		}
		h.markDirtyLocked(h.sendLoadedLocked(m.id, g, m.msg, takeRead(read, m.id)), r.pos)
	}
	h.groups[g].dispatched = r.pos
	h.groups[g].appended += int64(r.size)
}
