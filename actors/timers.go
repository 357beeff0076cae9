package actors

import (
	"container/heap"
	"context"
	"strings"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Event time and durable timers.
//
// Each pipeline with windows has a clock on the node (fold.Clock): the
// largest event time logged, and when. Every log record carries, for each
// such pipeline among its keys, the watermark its keys advance to before
// applying their inputs, and the clock after it; a new owner of the group
// resumes the clock from its checkpoint (the GroupClock stored with the
// snapshots) and the records it replays. Replay never reads a clock.
//
// A key's timers (window ends, the ends of allowed lateness) are in its
// state. The host indexes each group's keys by their next timer: the store
// keeps the index as of the checkpoint (persistence.Timer), the grains report
// changes, and a take-over reads it back. The timer loop, each
// WatermarkInterval, advances the watermarks and logs a record listing the
// keys whose timer is due (without inputs: they only advance), which wakes
// them even if they were passivated or the node restarted since. Firing is
// logged like an event, so replay fires the same timers at the same points.
//
// A watermark that advances with processing time (idle input) is logged
// too, about every idleLogStep, while keys wait for it: a restart resumes
// from where it stood instead of earning that advance again.

// groupClockKey names a group's GroupClock among its snapshots. Snapshot keys
// are "pipeline\x00key" with a non-empty pipeline, so it cannot collide.
const groupClockKey = "\x00clock"

// timerIndex is one group's keys of one pipeline by next timer: a map and a
// min-heap with lazy deletion (an entry whose time no longer matches the
// map's is stale and skipped).
type timerIndex struct {
	due  map[string]int64
	heap timerHeap
}

type timerEntry struct {
	due int64
	key string
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newTimerIndex() *timerIndex { return &timerIndex{due: map[string]int64{}} }

// set indexes key under due; 0 removes it.
func (x *timerIndex) set(key string, due int64) {
	if due == 0 {
		delete(x.due, key)
		return
	}
	if x.due[key] == due {
		return
	}
	// Its own copy: a grain's key may be in the grain's bytes (grain),
	// which the index would keep in memory after the key left it.
	key = strings.Clone(key)
	x.due[key] = due
	heap.Push(&x.heap, timerEntry{due, key})
	if len(x.heap) > 2*len(x.due)+1024 { // mostly stale: rebuild
		x.heap = x.heap[:0]
		for k, d := range x.due {
			x.heap = append(x.heap, timerEntry{d, k})
		}
		heap.Init(&x.heap)
	}
}

// popDue removes and returns the keys whose timer is at or below wm. They
// return to the index when their grain reports its next timer.
func (x *timerIndex) popDue(wm int64) []string {
	var keys []string
	for len(x.heap) > 0 && x.heap[0].due <= wm {
		e := heap.Pop(&x.heap).(timerEntry)
		if x.due[e.key] == e.due {
			delete(x.due, e.key)
			keys = append(keys, e.key)
		}
	}
	return keys
}

// indexLocked returns the index of pipeline in indexes, creating both.
func indexLocked(indexes *map[string]*timerIndex, pipeline string) *timerIndex {
	if *indexes == nil {
		*indexes = map[string]*timerIndex{}
	}
	x := (*indexes)[pipeline]
	if x == nil {
		x = newTimerIndex()
		(*indexes)[pipeline] = x
	}
	return x
}

// setTimer records a key's next timer (or, if expiry, when it expires),
// reported by its grain of epoch.
func (h *Host) setTimer(group uint32, epoch uint64, id keyID, due int64, expiry bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gs := &h.groups[group]
	if gs.epoch != epoch {
		return
	}
	indexes := &gs.timers
	if expiry {
		indexes = &gs.expiry
	}
	indexLocked(indexes, id.pipeline).set(id.key, due)
}

// expirySuffix marks a key's expiry among the store's timer entries (keys
// contain no NUL, so it cannot be part of a key).
const expirySuffix = "\x00x"

// idleLogStep is how far a pipeline's watermark may move past the last one
// logged, while keys of it wait for timers, before the timer loop logs it:
// what a crash can take back of an idle advance.
const idleLogStep = 1000 // ms

// clockTick asks for a record of group that logs pipeline's watermark.
type clockTick struct {
	group    uint32
	pipeline string
}

// timerLoop advances the watermarks and fires due timers until ctx ends.
func (h *Host) timerLoop(ctx context.Context) {
	if !h.timed && !h.expiring {
		return
	}
	t := time.NewTicker(h.cfg.WatermarkInterval)
	defer t.Stop()
	for await(h, ctx, t.C) {
		h.fireDue(ctx)
	}
}

// fireDue logs one record per group listing the keys whose timers are due at
// the current watermarks, and expiry checks for the keys whose ttl passed.
func (h *Host) fireDue(ctx context.Context) {
	now := h.cfg.Now().UnixMilli()
	var fires []keyID
	var expired map[string][]*fold.Event
	h.mu.Lock()
	wms := make(map[string]int64, len(h.clocks))
	for name, c := range h.clocks {
		wms[name] = h.cfg.Pipelines[name].WatermarkAt(c, now)
	}
	var ticks []clockTick
	ticked := map[string]bool{}
	for g := range h.groups {
		gs := &h.groups[g]
		if !gs.ready {
			continue
		}
		for pipeline, x := range gs.timers {
			for _, key := range x.popDue(wms[pipeline]) {
				fires = append(fires, keyID{pipeline, key})
			}
			// Keys wait for a later watermark: log the idle advance in the
			// first group that has them (the node's clock resumes from the
			// largest of its groups' clocks).
			if len(x.due) > 0 && !ticked[pipeline] && wms[pipeline] >= h.clockLogged[pipeline]+idleLogStep && h.cfg.Pipelines[pipeline].IdleAdvances() {
				ticked[pipeline] = true
				ticks = append(ticks, clockTick{uint32(g), pipeline})
			}
		}
		for pipeline, x := range gs.expiry {
			for _, key := range x.popDue(now) {
				if expired == nil {
					expired = map[string][]*fold.Event{}
				}
				expired[pipeline] = append(expired[pipeline], fold.ExpiryCheck(key))
			}
		}
	}
	h.mu.Unlock()
	var reqs []*ingestReq
	if len(fires) > 0 || len(ticks) > 0 {
		h.stats.timersFired.Add(int64(len(fires)))
		reqs = append(reqs, &ingestReq{fires: fires, ticks: ticks, w: newWaiter()})
	}
	for pipeline, checks := range expired {
		reqs = append(reqs, &ingestReq{pipeline: pipeline, events: checks, w: newWaiter()})
	}
	if len(reqs) == 0 {
		return
	}
	h.gate.RLock()
	defer h.gate.RUnlock()
	if h.closed {
		return // the next owner (or this node after restart) fires them
	}
	for _, req := range reqs {
		select {
		case h.queue <- req:
		case <-ctx.Done():
			return
		}
	}
}

// watermarksLocked returns, for each pipeline with windows among keys, the
// watermark a new record of group g carries: the node's at nowMs, never
// below what the group logged before. h.mu must be held.
func (h *Host) watermarksLocked(g uint32, pipelines map[string]bool, nowMs int64) map[string]int64 {
	wms := make(map[string]int64, len(pipelines))
	for name := range pipelines {
		c := h.clockLocked(name)
		w := h.cfg.Pipelines[name].WatermarkAt(c, nowMs)
		if last := h.groups[g].clocks[name]; last != nil {
			w = max(w, last.GetWatermarkMs())
		}
		wms[name] = w
	}
	return wms
}

// clockLocked returns the node's clock of a timed pipeline.
func (h *Host) clockLocked(pipeline string) *fold.Clock {
	c := h.clocks[pipeline]
	if c == nil {
		c = &fold.Clock{}
		h.clocks[pipeline] = c
	}
	return c
}

// loggedClockLocked records a pipeline's clock as a record of group g logged
// it, and lets the node's clock catch up with it (a take-over brings in the
// clocks of another node).
func (h *Host) loggedClockLocked(g uint32, w *keyfoldv1.Watermark) {
	p := h.cfg.Pipelines[w.GetPipeline()]
	if p == nil || !p.Timed() {
		return
	}
	gs := &h.groups[g]
	if gs.clocks == nil {
		gs.clocks = map[string]*keyfoldv1.Watermark{}
	}
	gs.clocks[w.GetPipeline()] = w
	c := h.clockLocked(w.GetPipeline())
	// Field by field: merging another node's clock (a take-over) can only
	// lower the idle advance this gives, never raise it, and the take-over
	// ends with Resume.
	c.MaxEvent = max(c.MaxEvent, w.GetMaxEventMs())
	c.Arrival = max(c.Arrival, w.GetArrivalMs())
	c.Base = max(c.Base, w.GetBaseMs())
	c.Watermark = max(c.Watermark, w.GetWatermarkMs())
	logged := p.Floor(&fold.Clock{MaxEvent: w.GetMaxEventMs(), Base: w.GetBaseMs(), Watermark: w.GetWatermarkMs()})
	h.clockLogged[w.GetPipeline()] = max(h.clockLogged[w.GetPipeline()], logged)
}

// parseTimerKey splits a timer entry's key into the key it indexes and
// whether it is the key's expiry.
func parseTimerKey(s string) (id keyID, expiry, ok bool) {
	s, expiry = strings.CutSuffix(s, expirySuffix)
	pipeline, key, ok := strings.Cut(s, "\x00")
	return keyID{pipeline, key}, expiry, ok && pipeline != "" && !strings.ContainsRune(key, 0)
}
