package keyfold

import (
	"context"

	"github.com/keyfold/keyfold/actors/fold"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi"
)

// localBackend adapts a Node to the node-to-node service (keyfold.v1.Cluster):
// this node's groups only.
type localBackend struct{ n *Node }

var _ grpcapi.LocalBackend = localBackend{}

func (b localBackend) SubmitLocal(ctx context.Context, from string, batch *keyfoldv1.ForwardBatch) (PendingIngest, error) {
	r, err := b.n.route(batch.Pipeline)
	if err != nil {
		return nil, err
	}
	return r.SubmitLocal(ctx, from, batch)
}

func (b localBackend) QueryLocal(ctx context.Context, pipeline, key string) (*keyfoldv1.GetStateResponse, error) {
	r, err := b.n.route(pipeline)
	if err != nil {
		return nil, err
	}
	v, err := r.QueryLocal(ctx, pipeline, key)
	if err != nil {
		return nil, err
	}
	return b.n.stateResponse(pipeline, key, v)
}

func (b localBackend) CallLocal(ctx context.Context, req *keyfoldv1.CallRequest) (fold.Reply, error) {
	r, err := b.n.route(req.Pipeline)
	if err != nil {
		return fold.Reply{}, err
	}
	return r.CallLocal(ctx, req.Pipeline, req.Key, req.Request, CallOptions{ID: req.Id, ReadOnly: req.ReadOnly})
}

func (b localBackend) DeleteLocal(ctx context.Context, pipeline, key string) error {
	h, err := b.n.serving(pipeline)
	if err != nil {
		return err
	}
	return h.Delete(ctx, pipeline, key)
}

func (b localBackend) Status(context.Context) *keyfoldv1.NodeStatus { return b.n.status() }

func (b localBackend) MembersChanged(from string, leaving bool) {
	b.n.router().MembersChanged(from, leaving)
}

func (b localBackend) Released(from string, groups []uint32) { b.n.router().Released(from, groups) }
