package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/persistence"
)

// AppendOutputs appends the outputs with one pipelined round trip (see
// appendOutputs).
func (s *Store) AppendOutputs(ctx context.Context, outputs []persistence.Output) error {
	if err := s.begin(ctx); err != nil {
		return s.wrap("append outputs", err)
	}
	if err := s.appendOutputs(ctx, outputs); err != nil {
		return s.wrap("append outputs", err)
	}
	return nil
}

// appendOutputs appends each output to its pipeline's stream with XADD and
// an automatic ID, all in one pipelined round trip (with a Redis Cluster
// client, one per node involved), those of one pipeline in order. It fails
// if any append failed or its outcome is unknown.
func (s *Store) appendOutputs(ctx context.Context, outputs []persistence.Output) error {
	if len(outputs) == 0 {
		return nil
	}
	cmds := make([]*redis.StringCmd, len(outputs))
	_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, o := range outputs {
			cmds[i] = p.XAdd(ctx, &redis.XAddArgs{Stream: s.k.output(o.Pipeline), ID: "*", Values: []any{"d", o.Data}})
		}
		return nil
	})
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("append output to %q: %w", outputs[i].Pipeline, err)
		}
	}
	return nil
}

// ReadOutputs returns up to limit entries of the pipeline's stream after a
// cursor, the ID of an entry, with one XRANGE. An entry's time is its ID's,
// the Redis server's clock when it appended the entry (Redis keeps IDs
// increasing even if its clock goes back).
func (s *Store) ReadOutputs(ctx context.Context, pipeline string, after string, limit int) ([]persistence.OutputEntry, error) {
	op := fmt.Sprintf("read outputs of %q", pipeline)
	if limit <= 0 {
		return nil, s.wrap(op, fmt.Errorf("limit %d is not positive", limit))
	}
	start, largest := "-", false
	if after != "" {
		var ok bool
		if ok, largest = validCursor(after); !ok {
			return nil, s.wrap(op+fmt.Sprintf(" after %q", after), persistence.ErrBadCursor)
		}
		start = "(" + after
	}
	if err := s.begin(ctx); err != nil {
		return nil, s.wrap(op, err)
	}
	if largest {
		return nil, s.wrap(op+fmt.Sprintf(" after %q", after), fmt.Errorf("past the last entry: %w", persistence.ErrBadCursor))
	}
	msgs, err := s.c.XRangeN(ctx, s.k.output(pipeline), start, "+", int64(limit)).Result()
	if err != nil {
		return nil, s.wrap(op, err)
	}
	if len(msgs) == 0 && after != "" {
		// Nothing after it: is it a cursor of this stream, or past its end?
		if err := s.checkCursor(ctx, pipeline, after); err != nil {
			return nil, s.wrap(op+fmt.Sprintf(" after %q", after), err)
		}
	}
	out := make([]persistence.OutputEntry, len(msgs))
	for i, m := range msgs {
		t, err := streamIDTime(m.ID)
		if err != nil {
			return nil, s.wrap(op, err)
		}
		d, ok := m.Values["d"].(string)
		if !ok {
			return nil, s.wrap(op, fmt.Errorf("output entry %s has no record", m.ID))
		}
		out[i] = persistence.OutputEntry{Cursor: m.ID, Time: t, Data: []byte(d)}
	}
	return out, nil
}

// checkCursor fails with ErrBadCursor if after is past the last ID the
// pipeline's stream ever generated (trims keep it).
func (s *Store) checkCursor(ctx context.Context, pipeline, after string) error {
	info, err := s.c.XInfoStream(ctx, s.k.output(pipeline)).Result()
	switch {
	case err != nil && strings.Contains(err.Error(), "no such key"):
		return fmt.Errorf("the pipeline has no outputs: %w", persistence.ErrBadCursor)
	case err != nil:
		return err
	}
	if compareIDs(after, info.LastGeneratedID) > 0 {
		return fmt.Errorf("past the last entry %s: %w", info.LastGeneratedID, persistence.ErrBadCursor)
	}
	return nil
}

// compareIDs orders two stream IDs "ms-seq" (both valid).
func compareIDs(a, b string) int {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	x, _ := strconv.ParseUint(am, 10, 64)
	y, _ := strconv.ParseUint(bm, 10, 64)
	if c := cmp.Compare(x, y); c != 0 {
		return c
	}
	x, _ = strconv.ParseUint(as, 10, 64)
	y, _ = strconv.ParseUint(bs, 10, 64)
	return cmp.Compare(x, y)
}

// TrimOutputs deletes the pipeline's entries appended before the
// millisecond of before with one XTRIM MINID (exact, not approximate).
func (s *Store) TrimOutputs(ctx context.Context, pipeline string, before time.Time) (int, error) {
	op := fmt.Sprintf("trim outputs of %q", pipeline)
	if err := s.begin(ctx); err != nil {
		return 0, s.wrap(op, err)
	}
	ms := before.UnixMilli()
	if ms <= 0 {
		return 0, nil // no ID is below 0-0
	}
	n, err := s.c.XTrimMinID(ctx, s.k.output(pipeline), strconv.FormatInt(ms, 10)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, s.wrap(op, err)
	}
	return int(n), nil
}
