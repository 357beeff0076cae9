package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// commitLoop is the group commit: it takes every ingest queued while the
// previous write was syncing, turns them into one log record per key group,
// appends all records in one call (one synced write), and hands each key its
// inputs in log order. It returns when the queue is closed and drained.
func (h *Host) commitLoop() {
	for {
		req, ok := <-h.queue
		if !ok {
			return
		}
		reqs := []*ingestReq{req}
		n := len(req.events)
	more:
		for n < h.cfg.MaxCommitEvents {
			select {
			case r, ok := <-h.queue:
				if !ok {
					break more
				}
				reqs = append(reqs, r)
				n += len(r.events)
			default:
				break more
			}
		}
		h.commit(reqs)
	}
}

// keyBatch is one key's share of a commit: its events, logged as the
// record's KeyInputs (encodeRecord) and then handed to it (msg).
type keyBatch struct {
	id  keyID
	msg applyMsg
	// Room for the key's first segment and its first event, which is all
	// most keys get in a commit once keys outnumber the commit's events:
	// with the keyBatches allocated together (batchSlab) a commit costs a
	// few allocations instead of three per key.
	seg0 [1]segment
	ev0  [1]*fold.Event
	// The timer loop took the key out of an index to wake it (fire) or to
	// check its expiry: if the record is not logged, it goes back.
	fire, expire bool
	// derived is set for a join's key that takes only its sides' events of
	// the commit: they are logged under the sides, so the key is not listed
	// in the record (unless a timer of it is due: fire).
	derived bool
	// g is the key's grain when the commit looked it up before its append
	// (prefetchLocked), if it was in memory then: the dispatch after the
	// append takes it if it is still the key's, without a second look-up
	// in the registry (at a million keys each is a cache miss or two, and
	// the two were a quarter of the commit loop; BENCHMARKS.md, session 22).
	g *grain
}

// batchSlab allocates a commit's keyBatches together, a slice at a time;
// a keyBatch stays where it is (the grains are handed &kb.msg).
type batchSlab struct{ next []keyBatch }

const batchSlabSize = 256

// maxKeptRecordBytes and maxKeptIndexKeys bound the records' buffer and
// the key index a commit keeps for the next one (larger ones, of unusual
// commits, go: a map keeps its size, and clearing it costs that).
const (
	maxKeptRecordBytes = 8 << 20
	maxKeptIndexKeys   = 1 << 16
)

func (s *batchSlab) new(id keyID) *keyBatch {
	if len(s.next) == cap(s.next) {
		s.next = make([]keyBatch, 0, batchSlabSize)
	}
	s.next = append(s.next, keyBatch{id: id})
	return &s.next[len(s.next)-1]
}

// groupBatch is one key group's share of a commit: one log record.
type groupBatch struct {
	group      uint32
	keys       []*keyBatch
	watermarks []*keyfoldv1.Watermark // of its pipelines with windows
	ticks      map[string]bool        // pipelines whose watermark it logs without keys
}

func (h *Host) commit(reqs []*ingestReq) {
	if err := h.Err(); err != nil {
		for _, r := range reqs {
			r.w.pending.Store(1)
			r.w.finish(0, err)
		}
		return
	}
	if reqs = h.refuseUnserved(reqs); len(reqs) == 0 {
		return
	}
	nowMs := h.cfg.Now().UnixMilli()
	events := 0
	for _, r := range reqs {
		events += len(r.events) + len(r.fires)
	}
	batches := make(map[uint32]*groupBatch)
	index := h.commitIndex // a key is in one group
	if index == nil {
		index = make(map[keyID]*keyBatch, batchSlabSize)
		h.commitIndex = index
	}
	defer func() {
		if len(index) > maxKeptIndexKeys {
			h.commitIndex = nil // (a commit of unusually many keys: timers firing at once)
		} else {
			clear(index)
		}
	}()
	// The slab is sized for the events, up to batchSlabSize: a commit of
	// many events to a few keys needs no more, and a key slow to take its
	// batch keeps only its slab's batches (and their events) in memory.
	slab := batchSlab{next: make([]keyBatch, 0, min(events, batchSlabSize))}
	groupOf := func(g uint32) *groupBatch {
		gb := batches[g]
		if gb == nil {
			gb = &groupBatch{group: g}
			batches[g] = gb
		}
		return gb
	}
	batchOf := func(id keyID) *keyBatch {
		kb := index[id]
		if kb == nil {
			gb := groupOf(h.GroupOf(id.pipeline, id.key))
			kb = slab.new(id)
			index[id] = kb
			gb.keys = append(gb.keys, kb)
		}
		return kb
	}
	var timed map[string]bool // pipelines with windows in this commit
	for _, r := range reqs {
		segs := 0
		for _, id := range r.fires {
			batchOf(id).fire = true // listed without inputs: it only advances
			if timed == nil {
				timed = map[string]bool{}
			}
			timed[id.pipeline] = true
		}
		for _, t := range r.ticks {
			gb := groupOf(t.group)
			if gb.ticks == nil {
				gb.ticks = map[string]bool{}
			}
			gb.ticks[t.pipeline] = true
			if timed == nil {
				timed = map[string]bool{}
			}
			timed[t.pipeline] = true
		}
		if p := h.cfg.Pipelines[r.pipeline]; p != nil && p.Timed() && len(r.events) > 0 {
			if timed == nil {
				timed = map[string]bool{}
			}
			timed[r.pipeline] = true
		}
		if len(r.events) > 0 && !r.events[0].Expire {
			for _, j := range h.joins[r.pipeline] {
				if timed == nil {
					timed = map[string]bool{}
				}
				timed[j.name] = true
			}
		}
		for _, ev := range r.events {
			kb := batchOf(keyID{r.pipeline, ev.Key})
			kb.expire = kb.expire || ev.Expire
			switch s := len(kb.msg.segs); {
			case s == 0:
				kb.seg0[0] = segment{nowMs: nowMs, w: r.w, events: kb.ev0[:0]}
				kb.msg.segs = kb.seg0[:]
				segs++
			case kb.msg.segs[s-1].w != r.w:
				kb.msg.segs = append(kb.msg.segs, segment{nowMs: nowMs, w: r.w})
				segs++
			}
			last := &kb.msg.segs[len(kb.msg.segs)-1]
			last.events = append(last.events, ev)
		}
		r.w.pending.Store(int64(segs))
	}
	if h.joins != nil {
		for _, gb := range batches {
			h.deriveJoins(gb, func(id keyID) *keyBatch {
				kb := index[id]
				if kb == nil {
					kb = batchOf(id)
					kb.derived = true
				}
				return kb
			})
		}
	}

	groups := make([]*groupBatch, 0, len(batches))
	entries := make([]persistence.Entry, 0, len(batches))
	h.mu.Lock()
	for _, gb := range batches {
		// A group being taken over cannot take inputs: they would be
		// applied before the replay of its log reaches them.
		if gs := &h.groups[gb.group]; !gs.ready || !gs.owned {
			failGroup(gb, gs.unavailable(gb.group))
			continue
		}
		groups = append(groups, gb)
	}
	slices.SortFunc(groups, func(a, b *groupBatch) int { return int(a.group) - int(b.group) })
	for _, gb := range groups {
		entries = append(entries, persistence.Entry{Group: gb.group, Epoch: h.groups[gb.group].epoch})
	}
	if timed != nil {
		h.stampLocked(reqs, groups, timed, nowMs)
	}
	if len(groups) == 0 {
		h.mu.Unlock()
		return
	}
	if down, full := h.storeDown.Load(), h.outq.n.Load() > MaxQueuedOutputs; down || full {
		err := fmt.Errorf("%w: the store is unreachable; retrying", ErrUnavailable)
		if full {
			err = fmt.Errorf("%w: %d results wait to be stored (the output log fails); retrying", ErrUnavailable, h.outq.n.Load())
		}
		h.refuseLocked(groups, err, nowMs)
		h.mu.Unlock()
		return
	}
	// The keys to activate are read while the append syncs. The read ends
	// before the commit returns, whatever happens (it looks in the snapshot
	// cache, which the host's end resets).
	pf := h.prefetchLocked(groups)
	if pf != nil {
		defer func() { <-pf.done }()
	}
	entered := h.entered // (see the dispatch below)
	h.mu.Unlock()
	// The records share one buffer, kept for the next commit (Append keeps
	// none of it): each commit allocated its records anew, a tenth of the
	// bytes allocated per event (BENCHMARKS.md, session 23).
	records := h.recordBuf[:0]
	defer func() {
		if cap(records) <= maxKeptRecordBytes {
			h.recordBuf = records[:0]
		}
	}()
	for i, gb := range groups {
		start := len(records)
		var err error
		if records, err = appendRecord(records, gb.keys, gb.watermarks); err != nil { // cannot happen for these messages
			err = fmt.Errorf("actors: encode record: %w", err)
			for _, gb := range groups {
				failGroup(gb, err)
			}
			h.fail(err)
			return
		}
		// (Capped: a record after it may reuse the spare room.)
		entries[i].Data = records[start:len(records):len(records)]
	}

	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	positions, err := h.store.Append(ctx, entries)
	cancel()
	h.stats.commits.Add(1)
	if errors.Is(err, persistence.ErrNoSpace) {
		// Refused before anything was written (a full disk): the groups'
		// memory still matches their logs, so they stay served. (The keys
		// read for activation are not needed.)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.refuseLocked(groups, fmt.Errorf("%w: %w", ErrUnavailable, hideStore("logging the batch", err)), nowMs)
		return
	}
	if pf != nil {
		<-pf.done
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	var lost map[uint32]persistence.Epoch
	// Logged and handed to the grains: bytes towards CheckpointBytes, and
	// deliveries (checkpointDeliveriesPerKey).
	var bytes, delivered int64
	for i, gb := range groups {
		pos := persistence.Position(0)
		if i < len(positions) {
			pos = positions[i]
		}
		gs := &h.groups[gb.group]
		if pos == 0 {
			// Whether the record reached the log is not known (a write can
			// fail after it landed; a newer owner may hold the group), so
			// the group's memory may no longer match its log: drop it and
			// take the group over again, which replays the log, the truth.
			if lost == nil {
				lost = make(map[uint32]persistence.Epoch)
			}
			if gs.ready && gs.epoch == entries[i].Epoch && !errors.Is(err, persistence.ErrFenced) {
				// Only for a group this append loses: its take-over's
				// claim clears the flag. (A group already lost and
				// claimed again since must not set it: no claim would
				// follow to clear it.)
				h.storeDown.Store(true)
			}
			lost[gb.group] = entries[i].Epoch
			failGroup(gb, fmt.Errorf("%w: key group %d: %w", ErrUnavailable, gb.group, hideStore("logging the batch", err)))
			continue
		}
		if !gs.ready || gs.epoch != entries[i].Epoch {
			// Logged, but the group was lost meanwhile: its take-over
			// replays the record (its claim came after this append).
			finishGroup(gb)
			continue
		}
		for _, kb := range gb.keys {
			kb.msg.pos = pos
			g := kb.g
			kb.g = nil // (the batch may outlive the grain's time in memory)
			if g != nil && g.tier != tierGone && g.epoch == gs.epoch && !h.stopped {
				// Still the key's: a grain leaves the registry only
				// as it is gone, and one of the group's epoch is the
				// one lookupLocked finds.
				h.deliverLocked(g, &kb.msg)
				h.markDirtyLocked(g, pos)
				continue
			}
			if g == nil && h.entered == entered {
				// In memory nowhere when the prefetch looked (under
				// h.mu, as now), and no key entered memory since but
				// this commit's own, each once: it still is not, and
				// needs no second look-up (a cache miss in a map of
				// the keys in memory; 2% of the CPU at ten million
				// keys).
				l := pf.take(kb.id)
				h.markDirtyLocked(h.activateLocked(kb.id, gb.group, &kb.msg, l), pos)
				entered = h.entered
				continue
			}
			h.markDirtyLocked(h.sendLoadedLocked(kb.id, gb.group, &kb.msg, pf.take(kb.id)), pos)
		}
		for _, w := range gb.watermarks {
			h.loggedClockLocked(gb.group, w)
		}
		gs.dispatched = pos
		gs.nowMs = max(gs.nowMs, nowMs)
		gs.appended += int64(len(entries[i].Data))
		bytes += int64(len(entries[i].Data))
		delivered += int64(len(gb.keys))
		if gs.unchecked() >= uint64(h.cfg.CheckpointRecords) {
			h.nudgeCheckpoint()
		}
	}
	h.deliveredSince.Add(delivered)
	if since := h.sinceCheckpoint.Add(bytes); since >= h.cfg.CheckpointBytes {
		if since+h.roundBytes.Load() >= h.cfg.CheckpointMaxBytes {
			h.hurryCheckpoint() // a paced round under way is too slow for the load
		}
		h.nudgeCheckpoint()
	}
	if h.lru.n > h.cfg.MaxActive {
		h.nudgePassivate()
	}
	if lost != nil {
		h.loseLocked(lost, err)
	}
}

// refuseUnserved answers, with ErrNotServed, the ingests that have an event
// of a group not served now (never owned here, released or lost since they
// were submitted): refused whole, nothing of them logged, so that a cluster
// node can route them again. The timer loop's requests go on: their groups fail alone
// below, and their keys go back into the indexes.
func (h *Host) refuseUnserved(reqs []*ingestReq) []*ingestReq {
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := reqs[:0]
	for _, r := range reqs {
		if r.fires == nil && len(r.events) > 0 && !r.events[0].Expire {
			if err := h.checkServedLocked(r.pipeline, r.events); err != nil {
				r.w.pending.Store(1)
				r.w.finish(0, err)
				continue
			}
		}
		kept = append(kept, r)
	}
	return kept
}

// stampLocked gives each group's record the watermarks of its pipelines
// with windows, and its keys of those pipelines the watermark to advance to:
// the node's at nowMs before this commit's events; and the clock after
// them, which moves the node's clock once the record is logged (events
// that fail to log move nothing). h.mu must be held.
func (h *Host) stampLocked(reqs []*ingestReq, groups []*groupBatch, timed map[string]bool, nowMs int64) {
	for _, gb := range groups {
		var mine map[string]bool
		for name := range gb.ticks {
			if mine == nil {
				mine = map[string]bool{}
			}
			mine[name] = true
		}
		for _, kb := range gb.keys {
			if timed[kb.id.pipeline] {
				if mine == nil {
					mine = map[string]bool{}
				}
				mine[kb.id.pipeline] = true
			}
		}
		if mine == nil {
			continue
		}
		wms := h.watermarksLocked(gb.group, mine, nowMs)
		for _, kb := range gb.keys {
			kb.msg.wm = wms[kb.id.pipeline]
		}
		for name, w := range wms {
			gb.watermarks = append(gb.watermarks, &keyfoldv1.Watermark{Pipeline: name, WatermarkMs: w})
		}
		slices.SortFunc(gb.watermarks, func(a, b *keyfoldv1.Watermark) int { return strings.Compare(a.Pipeline, b.Pipeline) })
	}
	after := map[string]*fold.Clock{}
	for _, r := range reqs {
		p := h.cfg.Pipelines[r.pipeline]
		if p == nil || !timed[r.pipeline] {
			continue
		}
		c := after[r.pipeline]
		if c == nil {
			c = new(fold.Clock)
			*c = *h.clockLocked(r.pipeline)
			after[r.pipeline] = c
		}
		for _, ev := range r.events {
			if !ev.Erase && !ev.Expire && !ev.Call { // a call is no event: no event time
				p.Observe(c, ev, nowMs)
			}
		}
	}
	// A join's clock observes the events of its sides.
	for _, r := range reqs {
		for _, j := range h.joins[r.pipeline] {
			c := after[j.name]
			if c == nil {
				c = new(fold.Clock)
				*c = *h.clockLocked(j.name)
				after[j.name] = c
			}
			p := h.cfg.Pipelines[j.name]
			for _, ev := range r.events {
				if !ev.Erase && !ev.Expire {
					p.Observe(c, ev, nowMs)
				}
			}
		}
	}
	for _, gb := range groups {
		for _, w := range gb.watermarks {
			c := after[w.Pipeline]
			if c == nil {
				c = h.clockLocked(w.Pipeline)
			}
			w.MaxEventMs, w.ArrivalMs, w.BaseMs = c.MaxEvent, c.Arrival, c.Base
		}
	}
}

// rearmLocked puts the keys the timer loop took out of a group's indexes
// back, due at once, when their record was not logged while the group stays
// served (a group that is lost is taken over, which reads its indexes
// again). h.mu must be held.
func (h *Host) rearmLocked(gb *groupBatch, nowMs int64) {
	gs := &h.groups[gb.group]
	if !gs.ready {
		return
	}
	for _, kb := range gb.keys {
		if kb.fire {
			indexLocked(&gs.timers, kb.id.pipeline).set(kb.id.key, 1)
		}
		if kb.expire {
			indexLocked(&gs.expiry, kb.id.pipeline).set(kb.id.key, nowMs)
		}
	}
}

// refuseLocked fails groups whose record was not written (nothing of them
// logged: they stay served) and puts back the keys the timer loop took out
// of their indexes. h.mu must be held.
func (h *Host) refuseLocked(groups []*groupBatch, err error, nowMs int64) {
	for _, gb := range groups {
		failGroup(gb, err)
		h.rearmLocked(gb, nowMs)
	}
}

// failGroup finishes every segment of a group that was not appended.
func failGroup(gb *groupBatch, err error) {
	for _, kb := range gb.keys {
		for _, s := range kb.msg.segs {
			s.w.finish(0, err)
		}
	}
}

// finishGroup finishes every segment of a group that was appended but will
// be applied by a replay (duplicates uncounted).
func finishGroup(gb *groupBatch) { failGroup(gb, nil) }

// nudgePassivate asks the passivation loop to passivate keys beyond
// MaxActive, without a checkpoint.
func (h *Host) nudgePassivate() {
	select {
	case h.passivateNow <- struct{}{}:
	default:
	}
}

// checkpointDue reports whether a checkpoint is due ahead of the interval.
// The loop asks it when nudged, and a nudge can be stale: one made while a
// checkpoint ran (a commit saw its group's records above a checkpoint
// position that checkpoint was about to advance) is covered once it ends,
// and acting on it wrote a second checkpoint of the keys changed
// meanwhile, at a million keys some 5-25% more snapshots (BENCHMARKS.md,
// session 15).
//
// Past CheckpointBytes (or a group's CheckpointRecords) a checkpoint is due
// once the keys changed since the last one began took
// checkpointDeliveriesPerKey deliveries each on average, and at
// CheckpointMaxBytes (or checkpointMaxRecords) whatever they took: a
// million keys under a uniform load take less than one event each in 64
// MiB of log, and a checkpoint then wrote a snapshot per event logged
// (BENCHMARKS.md, session 38). A memory budget full of changed keys
// (resident.needsCheckpoint) does not wait. It returns what makes a round
// due, named as the setting that decided ("" when none is): the checkpoint
// loop's debug line says it.
func (h *Host) checkpointDue() (why string) {
	logged := h.sinceCheckpoint.Load()
	if logged >= h.cfg.CheckpointMaxBytes {
		return "checkpoint_max_bytes"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resident.needsCheckpoint() { // as evictLocked nudges
		return "memory"
	}
	why, changed, most := "", 0, h.cfg.checkpointMaxRecords()
	if logged >= h.cfg.CheckpointBytes {
		why = "checkpoint_bytes"
	}
	for i := range h.groups { // as commit nudges
		gs := &h.groups[i]
		changed += gs.changed()
		if !gs.ready {
			continue
		}
		if u := gs.unchecked(); u >= most {
			return "records, at most"
		} else if u >= uint64(h.cfg.CheckpointRecords) && why == "" {
			why = "records"
		}
	}
	if why == "" || h.deliveredSince.Load() < checkpointDeliveriesPerKey*int64(changed) {
		return ""
	}
	return why
}

func (h *Host) nudgeCheckpoint() {
	select {
	case h.checkpointNow <- struct{}{}:
	default:
	}
}

// deriveJoins gives the keys of the joins that a group's keys feed the
// events of their sides, in the order of the group's keys: the order replay
// hands them over from the record (replayJoins). batchOf returns a join
// key's batch, adding it.
func (h *Host) deriveJoins(gb *groupBatch, batchOf func(keyID) *keyBatch) {
	for _, kb := range gb.keys[:len(gb.keys):len(gb.keys)] {
		for _, j := range h.joins[kb.id.pipeline] {
			var jb *keyBatch
			for _, seg := range kb.msg.segs {
				evs := sideEvents(seg.events)
				if len(evs) == 0 {
					continue
				}
				if jb == nil {
					jb = batchOf(keyID{j.name, kb.id.key})
				}
				jb.msg.segs = append(jb.msg.segs, segment{nowMs: seg.nowMs, events: evs, side: j.side, derived: true})
			}
		}
	}
}

// sideEvents returns the events a join takes of a side's: all but
// tombstones and expiry checks, which are the side key's own.
func sideEvents(evs []*fold.Event) []*fold.Event {
	for i, ev := range evs {
		if ev.Erase || ev.Expire {
			kept := slices.Clone(evs[:i])
			for _, ev := range evs[i+1:] {
				if !ev.Erase && !ev.Expire {
					kept = append(kept, ev)
				}
			}
			return kept
		}
	}
	return evs
}
