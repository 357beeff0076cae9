package embedded

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/keyfold/keyfold/persistence"
)

// pipeline is a pipeline's output log state, loaded on its first use.
//
// Checkpoints of different groups commit concurrently (and share WAL syncs),
// so the records of a pipeline do not become durable in sequence order: a
// checkpoint that took sequence numbers 5–6 may commit after one that took
// 7. A reader that saw 7 and resumed after it would miss 5 and 6 for good.
// So each checkpoint registers the range it takes as in flight until its
// commit returns, and readers see only the records at or below visible,
// below which every record is committed (or was abandoned by a failed
// commit: a gap, which readers skip). Only the allocation holds mu, not the
// commit.
//
// trim serialises the trims of the pipeline, so that their counts add up.
type pipeline struct {
	trim     sync.Mutex
	mu       sync.Mutex
	loaded   bool
	last     uint64   // the last sequence number taken
	lastMs   int64    // the time of that record; later ones never get an earlier one
	inflight []uint64 // the first sequence number of each range being committed
	visible  uint64   // every record at or below it is committed or abandoned
}

// pipeline returns a pipeline's state with its mu locked, loading it on
// first use.
func (s *Store) pipeline(name string) (*pipeline, error) {
	s.pipelinesMu.Lock()
	p := s.pipelines[name]
	if p == nil {
		p = &pipeline{}
		s.pipelines[name] = p
	}
	s.pipelinesMu.Unlock()
	p.mu.Lock()
	if !p.loaded {
		if err := s.inPebble(func() error { return s.loadPipeline(name, p) }); err != nil {
			p.mu.Unlock()
			return nil, fmt.Errorf("load output log: %w", err)
		}
		p.loaded = true
	}
	return p, nil
}

// loadPipeline reads a pipeline's last sequence number and time. Nothing of
// it is in flight: ranges are taken from loaded pipelines only. The caller
// runs it in inPebble, holding p.mu.
func (s *Store) loadPipeline(name string, p *pipeline) error {
	trimmed, err := getDecoded(s, outputTrimKey(name), decodeUint64)
	if err != nil && !errors.Is(err, pebble.ErrNotFound) {
		return err
	}
	p.last = trimmed
	lower, upper := outputBounds(name, 0, math.MaxUint64)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	if it.Last() {
		seq, err := outputSeq(it.Key())
		if err != nil {
			_ = it.Close()
			return err
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return err
		}
		ms, _, err := decodeOutput(v)
		if err != nil {
			_ = it.Close()
			return err
		}
		p.last, p.lastMs = max(p.last, seq), ms
	}
	if err := it.Close(); err != nil {
		return err
	}
	p.visible = p.last
	return nil
}

// take reserves the next n sequence numbers, from first on, and the time of
// their records. The caller holds p.mu, and must call p.done(first) once
// its commit is over, whatever its outcome.
func (p *pipeline) take(n int) (first uint64, ms int64) {
	first = p.last + 1
	p.last += uint64(n)
	p.lastMs = max(p.lastMs, time.Now().UnixMilli())
	p.inflight = append(p.inflight, first)
	return first, p.lastMs
}

// done ends the commit of the range that starts at first, and makes
// visible every record below the ranges still in flight.
func (p *pipeline) done(first uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.inflight, first); i >= 0 {
		p.inflight = slices.Delete(p.inflight, i, i+1)
	}
	if len(p.inflight) == 0 {
		p.visible = p.last
	} else {
		p.visible = slices.Min(p.inflight) - 1
	}
}

// outputRange is the sequence numbers a checkpoint took in one pipeline.
type outputRange struct {
	p     *pipeline
	first uint64
}

// addOutputs adds the outputs to the batch, taking their sequence numbers,
// and returns the ranges taken, which the caller must end with endOutputs
// after its commit (also when addOutputs fails).
func (s *Store) addOutputs(b *pebble.Batch, outputs []persistence.Output) ([]outputRange, error) {
	if len(outputs) == 0 {
		return nil, nil
	}
	// The outputs of each pipeline, in order, pipelines in order of first
	// appearance.
	var names []string
	byName := map[string][]int{}
	for i, o := range outputs {
		if _, ok := byName[o.Pipeline]; !ok {
			names = append(names, o.Pipeline)
		}
		byName[o.Pipeline] = append(byName[o.Pipeline], i)
	}
	ranges := make([]outputRange, 0, len(names))
	for _, name := range names {
		p, err := s.pipeline(name)
		if err != nil {
			return ranges, fmt.Errorf("pipeline %q: %w", name, err)
		}
		idx := byName[name]
		first, ms := p.take(len(idx))
		p.mu.Unlock()
		ranges = append(ranges, outputRange{p, first})
		for k, i := range idx {
			if err := b.Set(outputKey(name, first+uint64(k)), outputValue(ms, outputs[i].Data), nil); err != nil {
				return ranges, fmt.Errorf("pipeline %q: %w", name, err)
			}
		}
	}
	return ranges, nil
}

// endOutputs ends the commit of the ranges addOutputs took.
func endOutputs(ranges []outputRange) {
	for _, r := range ranges {
		r.p.done(r.first)
	}
}

// parseCursor returns the sequence number an output cursor names.
func parseCursor(c string) (uint64, error) {
	if c == "" {
		return 0, nil
	}
	seq, err := strconv.ParseUint(c, 10, 64)
	if err != nil {
		return 0, persistence.ErrBadCursor
	}
	return seq, nil
}

// AppendOutputs appends the outputs in one synced batch.
func (s *Store) AppendOutputs(ctx context.Context, outputs []persistence.Output) error {
	if err := s.begin(ctx); err != nil {
		return fmt.Errorf("embedded: append outputs: %w", err)
	}
	defer s.end()
	if len(outputs) == 0 {
		return nil
	}
	size := 0
	for _, o := range outputs {
		size += len(o.Data)
	}
	if err := s.checkSpace(size); err != nil {
		return fmt.Errorf("embedded: append outputs: %w", err)
	}
	b := s.db.NewBatch()
	defer closeBatch(&b)
	ranges, err := s.addOutputs(b, outputs)
	defer endOutputs(ranges)
	if err != nil {
		return fmt.Errorf("embedded: append outputs: %w", err)
	}
	if err := s.commit(&b); err != nil {
		return fmt.Errorf("embedded: append outputs: %w", err)
	}
	return nil
}

// ReadOutputs returns up to limit durable records of the pipeline after a
// cursor, which is the decimal sequence number of a record.
func (s *Store) ReadOutputs(ctx context.Context, name string, after string, limit int) ([]persistence.OutputEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("embedded: read outputs of %q: limit %d is not positive", name, limit)
	}
	seq, err := parseCursor(after)
	if err != nil {
		return nil, fmt.Errorf("embedded: read outputs of %q after %q: %w", name, after, err)
	}
	if err := s.begin(ctx); err != nil {
		return nil, fmt.Errorf("embedded: read outputs of %q: %w", name, err)
	}
	defer s.end()
	p, err := s.pipeline(name)
	if err != nil {
		return nil, fmt.Errorf("embedded: read outputs of %q: %w", name, err)
	}
	visible, last := p.visible, p.last
	p.mu.Unlock()
	if seq > last {
		return nil, fmt.Errorf("embedded: read outputs of %q after %q: past the last record %d: %w", name, after, last, persistence.ErrBadCursor)
	}
	if seq >= visible {
		return nil, nil
	}
	var out []persistence.OutputEntry
	err = s.inPebble(func() (err error) {
		out, err = s.readOutputs(name, seq+1, visible, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: read outputs of %q: %w", name, err)
	}
	return out, nil
}

// readOutputs returns up to limit records of the pipeline with sequence
// numbers from from through through. The caller runs it in inPebble.
func (s *Store) readOutputs(name string, from, through uint64, limit int) ([]persistence.OutputEntry, error) {
	lower, upper := outputBounds(name, from, through)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	var out []persistence.OutputEntry
	for valid := it.First(); valid && len(out) < limit; valid = it.Next() {
		seq, err := outputSeq(it.Key())
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		ms, data, err := decodeOutput(v)
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		out = append(out, persistence.OutputEntry{
			Cursor: strconv.FormatUint(seq, 10),
			Time:   time.UnixMilli(ms),
			Data:   append(make([]byte, 0, len(data)), data...),
		})
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, err
	}
	return out, nil
}

// TrimOutputs deletes the pipeline's oldest records, those appended before
// the millisecond of before, with one range deletion, and records the last
// sequence number it deleted so that none is reused. Records still being
// committed are left alone.
func (s *Store) TrimOutputs(ctx context.Context, name string, before time.Time) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, fmt.Errorf("embedded: trim outputs of %q: %w", name, err)
	}
	defer s.end()
	p, err := s.pipeline(name)
	if err != nil {
		return 0, fmt.Errorf("embedded: trim outputs of %q: %w", name, err)
	}
	p.mu.Unlock()
	p.trim.Lock()
	defer p.trim.Unlock()
	p.mu.Lock()
	visible := p.visible
	p.mu.Unlock()
	if visible == 0 {
		return 0, nil
	}

	// Records are in time order: count those before the cut.
	var n int
	var through uint64
	if err := s.inPebble(func() (err error) {
		n, through, err = s.countBefore(ctx, name, visible, before.UnixMilli())
		return err
	}); err != nil {
		return 0, fmt.Errorf("embedded: trim outputs of %q: %w", name, err)
	}
	if n == 0 {
		return 0, nil
	}
	b := s.db.NewBatch()
	defer closeBatch(&b)
	lower, upper := outputBounds(name, 0, through)
	if err := errors.Join(
		b.DeleteRange(lower, upper, nil),
		b.Set(outputTrimKey(name), encodeUint64(through), nil),
	); err != nil {
		return 0, fmt.Errorf("embedded: trim outputs of %q: %w", name, err)
	}
	if err := s.commit(&b); err != nil {
		return 0, fmt.Errorf("embedded: trim outputs of %q: %w", name, err)
	}
	return n, nil
}

// countBefore returns how many of the pipeline's records through visible
// were appended before the millisecond cut, and the sequence number of the
// last of them. The caller runs it in inPebble.
func (s *Store) countBefore(ctx context.Context, name string, visible uint64, cut int64) (n int, through uint64, err error) {
	lower, upper := outputBounds(name, 0, visible)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return 0, 0, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		if n%256 == 0 {
			if err := ctx.Err(); err != nil {
				_ = it.Close()
				return 0, 0, err
			}
		}
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			return 0, 0, err
		}
		ms, _, err := decodeOutput(v)
		if err != nil {
			_ = it.Close()
			return 0, 0, err
		}
		if ms >= cut {
			break
		}
		if through, err = outputSeq(it.Key()); err != nil {
			_ = it.Close()
			return 0, 0, err
		}
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, 0, err
	}
	return n, through, nil
}
