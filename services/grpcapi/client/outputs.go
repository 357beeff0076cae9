package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Outputs returns up to limit results of pipeline (window results) stored
// after the cursor after ("" from the oldest kept), oldest first, and the
// cursor to read the next page after: the last entry's, or after itself
// when there was nothing newer. A limit of 0 is the node's default (100);
// more than 10000 is an *Error with code InvalidArgument, as is a cursor
// the node did not make.
func (c *Client) Outputs(ctx context.Context, pipeline, after string, limit int) (outputs []*keyfoldv1.OutputEntry, next string, err error) {
	if limit < 0 {
		return nil, "", fmt.Errorf("keyfold client: negative limit %d", limit)
	}
	resp, err := c.api.ListOutputs(ctx, &keyfoldv1.ListOutputsRequest{Pipeline: pipeline, After: after, Limit: uint32(min(limit, math.MaxInt32))})
	if err != nil {
		return nil, "", wrap(err)
	}
	return resp.Outputs, resp.Next, nil
}

// Subscribe calls fn with every result of pipeline stored after the cursor
// after ("" from the oldest kept), in order, then with each new one as the
// node stores it, until ctx ends (Subscribe then returns nil) or fn returns
// an error (which Subscribe returns). fn runs on the caller's goroutine.
//
// Subscribe resumes a broken subscription: when the stream fails in a way
// that may heal (Unavailable — the node draining or restarting, a lost
// connection — or another code Retryable accepts), it subscribes again
// after the cursor of the last entry fn handled, waiting between attempts
// as the node's RetryInfo says or else 50 ms doubling up to 5 s (back to
// 50 ms once a subscription is accepted). It keeps trying until ctx ends;
// other failures (an unknown pipeline, a bad cursor) end it with an *Error.
// So fn sees each stored result once, in order, across breaks. Results are
// still delivered at least once by the node (a crash may store one again,
// under a new cursor, with the same Output.Id): deduplicate by id where
// that matters.
func (c *Client) Subscribe(ctx context.Context, pipeline, after string, fn func(*keyfoldv1.OutputEntry) error) error {
	attempt := 0 // failures since a subscription was last accepted
	for {
		var fnErr error
		accepted, err := c.subscribeOnce(ctx, pipeline, &after, func(e *keyfoldv1.OutputEntry) error {
			fnErr = fn(e)
			return fnErr
		})
		switch {
		case fnErr != nil:
			return fnErr
		case ctx.Err() != nil:
			return nil
		case !errors.Is(err, io.EOF) && !Retryable(err):
			return wrap(err)
		}
		if accepted {
			attempt = 0
		}
		t := time.NewTimer(backoff(attempt, err))
		attempt++
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// subscribeOnce runs one Subscribe stream until it fails or fn does,
// advancing *after past each entry fn handled. accepted tells whether the
// node took the subscription. A stream the node ended cleanly is io.EOF.
func (c *Client) subscribeOnce(ctx context.Context, pipeline string, after *string, fn func(*keyfoldv1.OutputEntry) error) (accepted bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.api.Subscribe(ctx, &keyfoldv1.SubscribeRequest{Pipeline: pipeline, After: *after})
	if err != nil {
		return false, err
	}
	// The node sends its headers once it checked the pipeline and the
	// cursor; a refusal comes without them.
	md, _ := s.Header()
	accepted = md != nil
	for {
		e, err := s.Recv()
		if err != nil {
			return accepted, err
		}
		if err := fn(e); err != nil {
			return accepted, err
		}
		*after = e.Cursor
	}
}
