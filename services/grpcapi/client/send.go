package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
)

// SendOptions configures Send. The zero value is a sane default.
type SendOptions struct {
	Batch  int // events per batch (default 500)
	Window int // batches awaiting their acks (default 8)

	// OnRejected, if set, is told about each event the node rejects (its
	// index in the sequence, from 0, and why); Send skips the event and
	// sends the rest of its batch again. If nil, a rejected event fails
	// Send.
	OnRejected func(index int, err *Error)
	// OnAcked, if set, is told about each batch acknowledged (durable):
	// its number of events and its result. For progress reports.
	OnAcked func(events int, r Result)
}

// Summary is what Send did.
type Summary struct {
	Sent       int // events acknowledged or rejected
	Accepted   int
	Duplicates int
	Rejected   int
}

// Send streams events to a pipeline in batches on IngestStream, with up to
// Window batches in flight, and returns once every event is durable (or
// rejected): "send these events, tell me when they are durable". If the
// sequence yields an error, the events before it are still sent and
// settled, and Send returns that error with the summary of what they did. A batch
// that fails in a way that may succeed later (the node unavailable or
// overloaded, the stream broken) is sent again with Ingest's retries, which
// is safe for events with ids. Batches go in order; a batch sent again goes
// after those already in flight. Callbacks run on Send's goroutines, one at
// a time.
func (c *Client) Send(ctx context.Context, pipeline string, events iter.Seq2[[]byte, error], o SendOptions) (Summary, error) {
	if o.Batch <= 0 {
		o.Batch = 500
	}
	if o.Window <= 0 {
		o.Window = 8
	}
	s := &sender{c: c, pipeline: pipeline, o: o}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err := s.run(ctx, events)
	s.settling.Wait()
	if err == nil {
		err = s.failed()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sum, err
}

type sender struct {
	c        *Client
	pipeline string
	o        SendOptions

	mu    sync.Mutex // guards sum and fatal, and serialises callbacks
	sum   Summary
	fatal error

	settling sync.WaitGroup // failed batches being sent again
}

// sendBatch is a batch and the index of its first event in the sequence.
type sendBatch struct {
	first  int
	events [][]byte
}

func (s *sender) run(ctx context.Context, events iter.Seq2[[]byte, error]) error {
	var stream *Stream
	defer func() {
		if stream != nil {
			stream.Close()
		}
	}()
	n := 0
	b := &sendBatch{}
	flush := func() error {
		if len(b.events) == 0 {
			return nil
		}
		batch := b
		b = &sendBatch{first: n}
		for {
			if err := s.failed(); err != nil {
				return err
			}
			if stream == nil {
				var err error
				if stream, err = s.c.Stream(ctx, s.pipeline, s.o.Window); err != nil {
					// Cannot stream now: this batch on its own.
					s.settle(ctx, batch, err, false)
					return s.failed()
				}
			}
			err := stream.Send(batch.events, func(r Result, err error) {
				if err != nil {
					// Off the stream's receiving goroutine: the acks of
					// the other batches must not wait for this one.
					s.settling.Add(1)
					go s.settle(ctx, batch, err, true)
					return
				}
				s.acked(len(batch.events), r)
			})
			if err == nil {
				return nil
			}
			stream.Close() // broken: a new one for this batch and the next
			stream = nil
		}
	}
	var inputErr error
	for ev, err := range events {
		if err != nil {
			// What was read before the failure is still sent and
			// acknowledged: the summary then says exactly what is durable.
			inputErr = fmt.Errorf("after event %d: %w", n, err)
			break
		}
		n++
		b.events = append(b.events, ev)
		if len(b.events) == s.o.Batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if inputErr != nil {
		if stream != nil {
			stream.Close() // waits for the acks of what is in flight
			stream = nil
		}
		return inputErr
	}
	if stream != nil {
		err := stream.Close()
		stream = nil
		if err != nil && s.failed() == nil {
			return err
		}
	}
	return nil
}

func (s *sender) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fatal
}

func (s *sender) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fatal == nil {
		s.fatal = err
	}
}

func (s *sender) acked(n int, r Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sum.Sent += n
	s.sum.Accepted += r.Accepted
	s.sum.Duplicates += r.Duplicates
	if s.o.OnAcked != nil {
		s.o.OnAcked(n, r)
	}
}

// settle finishes a batch whose ack was a failure: it drops the events the
// node rejects and sends the rest again on its own with Ingest (which
// retries as the client's options say), until it is acknowledged or fails
// for good. A batch whose stream broke is sent again only if the client
// retries at all.
func (s *sender) settle(ctx context.Context, b *sendBatch, err error, async bool) {
	if async {
		defer s.settling.Done()
	}
	events := b.events
	retried := false
	index := make([]int, len(events)) // each event's index in the sequence
	for i := range index {
		index[i] = b.first + i
	}
	for {
		if ctx.Err() != nil {
			s.fail(fmt.Errorf("events %d..%d: %w (last failure: %w)", b.first, b.first+len(b.events)-1, ctx.Err(), err))
			return
		}
		var ce *Error
		switch {
		case errors.As(err, &ce) && ce.Code == codes.InvalidArgument && ce.EventIndex >= 0 && ce.EventIndex < len(events):
			i := ce.EventIndex
			if s.o.OnRejected == nil {
				s.fail(fmt.Errorf("event %d: %w", index[i], err))
				return
			}
			s.mu.Lock()
			s.sum.Sent++
			s.sum.Rejected++
			s.o.OnRejected(index[i], ce)
			s.mu.Unlock()
			events = slices.Delete(slices.Clone(events), i, i+1)
			index = slices.Delete(index, i, i+1)
		case retried:
			// Ingest's own retries are spent.
			s.fail(fmt.Errorf("events %d..%d: %w", b.first, b.first+len(b.events)-1, err))
			return
		case s.c.opts.MaxRetries > 0 && (Retryable(err) || errors.Is(err, ErrStreamBroken)):
			// Sent again below, once: Ingest retries by itself.
			retried = true
		default:
			s.fail(fmt.Errorf("events %d..%d: %w", b.first, b.first+len(b.events)-1, err))
			return
		}
		if len(events) == 0 {
			return
		}
		var r Result
		if r, err = s.c.Ingest(ctx, s.pipeline, events); err == nil {
			s.acked(len(events), r)
			return
		}
	}
}
