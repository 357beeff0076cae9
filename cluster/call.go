package cluster

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Call calls a key's handler at its owner (the Cluster service's Call for
// another member's key). Like a deletion, a logged call is routed again
// only when it was refused (nothing logged): one sent again with an unknown
// outcome could run twice (a call with an id would not: its retry gets the
// first reply, but the caller decides). A read-only call is routed again
// as a query is.
func (c *Node) Call(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error) {
	var r fold.Reply
	err := c.retry(ctx, pipeline, key, func(owner string) (bool, error) {
		if owner == c.self {
			var err error
			r, err = c.CallLocal(ctx, pipeline, key, req, o)
			if o.ReadOnly {
				return errors.Is(err, actors.ErrUnavailable), err
			}
			return errors.Is(err, actors.ErrNotServed), err
		}
		cl, err := c.peers.Client(owner)
		if err != nil {
			return o.ReadOnly || errors.Is(err, ErrNotSent), fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
		}
		resp, err := cl.Call(ctx, &keyfoldv1.CallRequest{Pipeline: pipeline, Key: key, Request: req, Id: o.ID, ReadOnly: o.ReadOnly})
		if err != nil {
			st := status.Convert(err)
			again := st.Code() == codes.FailedPrecondition || (o.ReadOnly && retryable(err))
			return again, callRemoteError(owner, st)
		}
		r = fold.Reply{Value: resp.GetReply().GetReply(), Duplicate: resp.GetReply().GetDuplicate(), Err: resp.GetError()}
		return false, r.Error()
	})
	return r, err
}

// callRemoteError is an owner's refusal of a call as this node's callers
// see it: the errors of a request the owner found bad (which this node
// checked too, so only a differently configured owner gives them) keep
// their sentinels.
func callRemoteError(owner string, st *status.Status) error {
	switch st.Code() {
	case codes.Unimplemented:
		return fmt.Errorf("%w: key group owner %s: %s", fold.ErrNoCallHandler, owner, st.Message())
	case codes.InvalidArgument:
		return fmt.Errorf("%w: key group owner %s: %s", fold.ErrInvalidCall, owner, st.Message())
	}
	return remoteError(owner, st.Code(), st.Message())
}

// CallLocal calls a key of a group this node serves (this node's share of
// Call, and the Cluster service's Call). A read-only call reads, so the
// node's lease is confirmed around it as for QueryLocal; a logged one is
// fenced by its group's epoch, as an ingest is.
func (c *Node) CallLocal(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error) {
	if !o.ReadOnly {
		return c.host.Call(ctx, pipeline, key, req, o)
	}
	g := c.host.GroupOf(pipeline, key)
	if err := c.checkRead(g); err != nil {
		return fold.Reply{}, err
	}
	r, err := c.host.Call(ctx, pipeline, key, req, o)
	if err != nil && !errors.Is(err, fold.ErrCallFailed) {
		return fold.Reply{}, err
	}
	if err := c.checkRead(g); err != nil {
		return fold.Reply{}, err
	}
	return r, r.Error()
}
