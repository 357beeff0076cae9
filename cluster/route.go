package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Routing: a batch is validated whole here, split by owner, this node's
// share queued with its host and each other share with its owner (Peers:
// one Forward call in flight per owner, in order). A share refused because
// its owner does not serve the group yet (nothing of it was logged) is
// routed again with the next member list. Queries and deletions go to the
// key's owner, and are routed again while the owner refuses them.

// A refused call is routed again when the member list changes, or after a
// backoff: the new owner may still be taking the group over (its take-over
// ends without notice here), so the backoff stays short.
const (
	rerouteBackoff    = 10 * time.Millisecond
	maxRerouteBackoff = 100 * time.Millisecond
)

// rerouteFor bounds how long a refused share or a query is routed again
// before the caller gets ErrUnavailable.
const rerouteFor = 10 * time.Second

// Routable reports whether the node has a member list to route calls
// with; until then calls are ErrNotReady.
func (c *Node) Routable() bool { return c.view.Load() != nil }

// Self is this node's member id.
func (c *Node) Self() string { return c.self }

// ownerOf returns the current owner of a key's group and the view.
func (c *Node) ownerOf(pipeline, key string) (string, *view) {
	v := c.view.Load()
	return v.a.Owner(c.host.GroupOf(pipeline, key)), v
}

// Submit validates a batch of pipeline's events whole and queues each share
// with its owner: this node's with the host, the others with their owners.
// Batches submitted one after the other are logged in that order for each
// key, but a share routed again while its group moves may come after a
// later batch.
func (c *Node) Submit(ctx context.Context, pipeline string, raws [][]byte) (actors.Pending, error) {
	p, ok := c.pipelines[pipeline]
	if !ok {
		return nil, fmt.Errorf("%w %q", actors.ErrUnknownPipeline, pipeline)
	}
	events, err := p.PrepareBatch(raws)
	if err != nil {
		return nil, err
	}
	r := &routedIngest{c: c, pipeline: pipeline, start: time.Now()}
	if r.parts, err = c.route(ctx, pipeline, events, true); err != nil {
		return nil, err
	}
	return r, nil
}

// SubmitLocal queues a batch another node forwarded (the Cluster service's
// Forward) with the host, never forwarding it further: a batch with an
// event of a group not served here is refused whole (ErrNotServed).
//
// The events are applied as the sender read them (fold.Pipeline.Forwarded:
// the encoding is checked to be well formed and within bounds, and every
// key to be one, but the events are not parsed again) when from is a
// member in this node's member list and its pipeline has this one's
// fingerprint. Otherwise they are validated here as a public ingest's: a
// node that is not a member (it left, or never was one), or one configured
// differently, is not taken at its word.
func (c *Node) SubmitLocal(ctx context.Context, from string, b *keyfoldv1.ForwardBatch) (actors.Pending, error) {
	p, ok := c.pipelines[b.Pipeline]
	if !ok {
		return nil, fmt.Errorf("%w %q", actors.ErrUnknownPipeline, b.Pipeline)
	}
	var events []*fold.Event
	var err error
	if c.isMember(from) && b.PipelineFingerprint == p.Fingerprint() && p.Fingerprint() != 0 {
		events, err = p.Forwarded(b.Events, b.Keys, b.Prepared)
	} else {
		events, err = p.PrepareBatch(b.Events)
	}
	if err != nil {
		return nil, err
	}
	pend, err := c.host.SubmitEvents(ctx, b.Pipeline, events)
	if err != nil {
		return nil, err
	}
	c.received.Add(int64(len(events)))
	return pend, nil
}

// isMember reports whether id is another member in the current member list.
func (c *Node) isMember(id string) bool {
	v := c.view.Load()
	if v == nil || id == c.self {
		return false
	}
	_, ok := slices.BinarySearch(v.a.Members, id)
	return ok
}

// part is the share of a routed batch that one owner logs.
type part struct {
	owner  string
	events []*fold.Event
	bytes  int                     // of the events as forwarded
	batch  *keyfoldv1.ForwardBatch // a remote owner's: the events as sent
	local  actors.Pending
	remote *Share
	err    error // refused or failed before it was sent
}

// add adds an event (with its prepared encoding, for a remote owner).
func (p *part) add(ev *fold.Event, prepared []byte, size int) {
	p.events = append(p.events, ev)
	p.bytes += size
	if p.batch != nil {
		p.batch.Events = append(p.batch.Events, ev.Raw)
		p.batch.Keys = append(p.batch.Keys, ev.Key)
		p.batch.Prepared = append(p.batch.Prepared, prepared...)
	}
}

// routedIngest is a batch split among owners.
type routedIngest struct {
	c        *Node
	pipeline string
	parts    []*part
	start    time.Time
}

// route queues the shares of events. With first, an error of this node's
// own share (other than a refusal) fails the whole batch before anything
// is forwarded. A remote share carries what this node read of each event
// (fold's prepared encoding), so that its owner does not parse it again.
func (c *Node) route(ctx context.Context, pipeline string, events []*fold.Event, first bool) ([]*part, error) {
	v := c.view.Load()
	pl := c.pipelines[pipeline]
	// Each owner's events, by key group, in batch order; a remote owner's
	// with their encodings (subslices of one buffer per owner).
	type groupEvents struct {
		events   []*fold.Event
		prepared [][]byte
		sizes    []int
		bytes    int
	}
	var owners []string
	byGroup := map[string]map[uint32]*groupEvents{}
	groupOrder := map[string][]uint32{}
	encoded := map[string][]byte{}
	for _, ev := range events {
		g := c.host.GroupOf(pipeline, ev.Key)
		o := v.a.Owner(g)
		if byGroup[o] == nil {
			byGroup[o] = map[uint32]*groupEvents{}
			owners = append(owners, o)
		}
		ge := byGroup[o][g]
		if ge == nil {
			ge = &groupEvents{}
			byGroup[o][g] = ge
			groupOrder[o] = append(groupOrder[o], g)
		}
		size := len(ev.Raw)
		var prep []byte
		if o != c.self {
			buf := encoded[o]
			start := len(buf)
			buf = pl.AppendPrepared(buf, ev)
			encoded[o], prep = buf, buf[start:]
			size += len(ev.Key) + len(prep)
		}
		ge.events = append(ge.events, ev)
		ge.prepared = append(ge.prepared, prep)
		ge.sizes = append(ge.sizes, size)
		ge.bytes += size
	}
	// A remote share goes in messages the owner accepts (they frame events
	// less tightly than a JSON body), each refused or logged whole: a piece
	// holds whole key groups where it can, so that a refused piece, routed
	// again, holds every event of its keys (their order kept).
	// This node's share first, so that a batch it cannot take (draining,
	// unknown pipeline) fails before any share leaves.
	if i := slices.Index(owners, c.self); i > 0 {
		owners[0], owners[i] = owners[i], owners[0]
	}
	var parts []*part
	newPart := func(o string) *part {
		p := &part{owner: o}
		if o != c.self {
			p.batch = &keyfoldv1.ForwardBatch{Pipeline: pipeline, PipelineFingerprint: pl.Fingerprint()}
		}
		parts = append(parts, p)
		return p
	}
	for _, o := range owners {
		p := newPart(o)
		for _, g := range groupOrder[o] {
			ge := byGroup[o][g]
			if o != c.self && len(p.events) > 0 && p.bytes+ge.bytes > c.maxForward {
				p = newPart(o)
			}
			for i, ev := range ge.events {
				if o != c.self && len(p.events) > 0 && p.bytes+ge.sizes[i] > c.maxForward {
					p = newPart(o) // one group above the limit: split it
				}
				p.add(ev, ge.prepared[i], ge.sizes[i])
			}
		}
	}
	for _, p := range parts {
		switch p.owner {
		case "":
			p.err = notServed(errors.New("no members"))
		case c.self:
			pend, err := c.host.SubmitEvents(ctx, pipeline, p.events)
			if err != nil && first && !errors.Is(err, actors.ErrNotServed) {
				return nil, err
			}
			p.local, p.err = pend, err
		default:
			s, err := c.peers.Forward(ctx, p.owner, p.batch, p.bytes)
			switch {
			case errors.Is(err, ErrNotSent):
				err = notServed(err)
			case err != nil && ctx.Err() == nil:
				err = fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
			}
			p.remote, p.err = s, err
			c.forwarded.Add(int64(len(p.events)))
		}
		first = false
	}
	return parts, nil
}

// Wait waits for every share. Refused shares (nothing of them logged) are
// routed again with the next member list, for up to rerouteFor, unless
// another share failed: then the caller retries the batch, and a share
// applied meanwhile would count twice.
func (r *routedIngest) Wait(ctx context.Context) (actors.Result, error) {
	var res actors.Result
	parts := r.parts
	backoff := rerouteBackoff
	for {
		var again []*fold.Event
		var failed, refused error
		for _, p := range parts {
			pr, err := p.wait(ctx)
			switch {
			case err == nil:
				res.Accepted += pr.Accepted
				res.Duplicates += pr.Duplicates
			case errors.Is(err, actors.ErrNotServed):
				again = append(again, p.events...)
				refused = err
			case failed == nil:
				failed = err
			}
		}
		switch {
		case failed != nil:
			return res, failed
		case len(again) == 0:
			return res, nil
		case time.Since(r.start) > rerouteFor:
			return res, refused
		}
		r.c.rerouted.Add(int64(len(again)))
		if !r.c.awaitChange(ctx, r.c.view.Load(), &backoff) {
			return res, ctx.Err()
		}
		var err error
		if parts, err = r.c.route(ctx, r.pipeline, again, false); err != nil {
			return res, err
		}
	}
}

func (p *part) wait(ctx context.Context) (actors.Result, error) {
	switch {
	case p.err != nil:
		return actors.Result{}, p.err
	case p.local != nil:
		return p.local.Wait(ctx)
	}
	fr, err := p.remote.Wait(ctx)
	switch {
	case errors.Is(err, ErrNotSent):
		return actors.Result{}, notServed(err)
	case err != nil:
		if ctx.Err() != nil {
			return actors.Result{}, err
		}
		return actors.Result{}, fmt.Errorf("%w: the outcome is unknown: %w", actors.ErrUnavailable, err)
	case fr.Refused:
		return actors.Result{}, notServed(fmt.Errorf("%s: %s", p.owner, fr.GetError().GetMessage()))
	case fr.Error != nil:
		return actors.Result{}, remoteError(p.owner, codes.Code(fr.Error.Code), fr.Error.Message)
	}
	return actors.Result{Accepted: int(fr.Accepted), Duplicates: int(fr.Duplicates)}, nil
}

// notServed marks a share that nothing of was logged (refused, or never
// sent): the caller routes it again, or answers 503 if it gives up.
func notServed(err error) error {
	return fmt.Errorf("%w: %w: %w", actors.ErrNotServed, actors.ErrUnavailable, err)
}

// remoteError is an owner's error as this node's callers see it.
func remoteError(owner string, code codes.Code, msg string) error {
	switch code {
	case codes.Canceled:
		return fmt.Errorf("key group owner %s: %w", owner, context.Canceled)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.FailedPrecondition:
		return fmt.Errorf("%w: key group owner %s: %s", actors.ErrUnavailable, owner, msg)
	case codes.ResourceExhausted:
		return fmt.Errorf("%w: key group owner %s: %s", actors.ErrBusy, owner, msg)
	case codes.InvalidArgument, codes.NotFound, codes.Unimplemented:
		// Valid here: the owner's configuration (or version) differs.
		return fmt.Errorf("keyfold: key group owner %s refused the call (is its configuration the same?): %s: %s", owner, code, msg)
	}
	return fmt.Errorf("keyfold: key group owner %s failed: %s: %s", owner, code, msg)
}

// retry calls fn with the owner of a key until it succeeds, fails for good,
// or rerouteFor passes: fn reports whether its error is worth routing again
// (the owner changed, or does not serve the group yet).
func (c *Node) retry(ctx context.Context, pipeline, key string, fn func(owner string) (again bool, err error)) error {
	start, backoff := time.Now(), rerouteBackoff
	for {
		owner, v := c.ownerOf(pipeline, key)
		again, err := fn(owner)
		if !again || time.Since(start) > rerouteFor {
			return err
		}
		if !c.awaitChange(ctx, v, &backoff) {
			return err
		}
	}
}

// awaitChange waits before a call is routed again: until the member list
// changes (v is the one the call was routed with; the renew loop is asked
// to read it now) or the backoff passes, which it then doubles. False if
// ctx ended.
func (c *Node) awaitChange(ctx context.Context, v *view, backoff *time.Duration) bool {
	c.askRefresh()
	t := time.NewTimer(*backoff)
	defer t.Stop()
	*backoff = min(2**backoff, maxRerouteBackoff)
	select {
	case <-v.next:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// retryable reports whether a remote call's error is worth routing again.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unavailable:
		return true
	}
	return false
}

// Query reads a key's state at its owner.
func (c *Node) Query(ctx context.Context, pipeline, key string) (actors.KeyView, error) {
	var kv actors.KeyView
	err := c.retry(ctx, pipeline, key, func(owner string) (bool, error) {
		if owner == c.self {
			var err error
			kv, err = c.QueryLocal(ctx, pipeline, key)
			return errors.Is(err, actors.ErrUnavailable), err
		}
		cl, err := c.peers.Client(owner)
		if err != nil {
			return true, fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
		}
		resp, err := cl.GetState(ctx, &keyfoldv1.GetStateRequest{Pipeline: pipeline, Key: key})
		if err != nil {
			st := status.Convert(err)
			if st.Code() == codes.NotFound && !strings.Contains(st.Message(), "unknown pipeline") {
				return false, fmt.Errorf("%w: %q in pipeline %q", actors.ErrNotFound, key, pipeline)
			}
			return retryable(err), remoteError(owner, st.Code(), st.Message())
		}
		kv, err = decodeState(resp, c.specs[pipeline])
		return false, err
	})
	return kv, err
}

// QueryLocal reads a key of a group this node serves (this node's share
// of Query, and the Cluster service's GetState). The node's lease must be
// confirmed before and after the key answers (see checkRead): after, so
// that an answer delayed by a pause of the process is still one no other
// member could have made stale.
func (c *Node) QueryLocal(ctx context.Context, pipeline, key string) (actors.KeyView, error) {
	g := c.host.GroupOf(pipeline, key)
	if err := c.checkRead(g); err != nil {
		return actors.KeyView{}, err
	}
	kv, err := c.host.Query(ctx, pipeline, key)
	if err != nil {
		return actors.KeyView{}, err
	}
	if err := c.checkRead(g); err != nil {
		return actors.KeyView{}, err
	}
	return kv, nil
}

// Delete erases a key at its owner.
func (c *Node) Delete(ctx context.Context, pipeline, key string) error {
	if err := fold.CheckKey(key); err != nil {
		return err
	}
	return c.retry(ctx, pipeline, key, func(owner string) (bool, error) {
		// Routed again only when refused (nothing logged): a deletion
		// logged with an unknown outcome and sent again would erase what
		// was acknowledged in between.
		if owner == c.self {
			err := c.host.Delete(ctx, pipeline, key)
			return errors.Is(err, actors.ErrNotServed), err
		}
		cl, err := c.peers.Client(owner)
		if err != nil {
			return errors.Is(err, ErrNotSent), fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
		}
		if _, err := cl.DeleteKey(ctx, &keyfoldv1.DeleteKeyRequest{Pipeline: pipeline, Key: key}); err != nil {
			st := status.Convert(err)
			return st.Code() == codes.FailedPrecondition, remoteError(owner, st.Code(), st.Message())
		}
		return false, nil
	})
}
