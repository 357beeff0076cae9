package grpcapi

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// LocalBackend is what the node-to-node service (keyfold.v1.Cluster,
// proto/keyfold/v1/cluster.proto) serves: the receiving node's own key
// groups, never forwarding further (so that two nodes that disagree about
// placement cannot bounce a request between them).
type LocalBackend interface {
	// SubmitLocal queues a batch member from validated (its share for this
	// node) on this node. A batch with an event of a key group not served
	// here fails, before anything of it is logged, with an error wrapping
	// actors.ErrNotServed.
	SubmitLocal(ctx context.Context, from string, batch *keyfoldv1.ForwardBatch) (actors.Pending, error)
	// QueryLocal and DeleteLocal act on a key of a group served here; for
	// another group they fail with an error wrapping actors.ErrNotOwner or
	// actors.ErrUnavailable.
	QueryLocal(ctx context.Context, pipeline, key string) (*keyfoldv1.GetStateResponse, error)
	DeleteLocal(ctx context.Context, pipeline, key string) error
	// CallLocal calls a key of a group served here (or fails as
	// QueryLocal does); the handler's failure of the call is an error
	// wrapping fold.ErrCallFailed.
	CallLocal(ctx context.Context, req *keyfoldv1.CallRequest) (fold.Reply, error)
	// Status describes the node.
	Status(ctx context.Context) *keyfoldv1.NodeStatus
	// MembersChanged asks the node to read the member list now; leaving
	// says the sender is leaving.
	MembersChanged(from string, leaving bool)
	// Released notes that member from released groups, which placement
	// now gives this node.
	Released(from string, groups []uint32)
}

// RegisterCluster registers the node-to-node service on s.
func RegisterCluster(s grpc.ServiceRegistrar, b LocalBackend, logger *slog.Logger) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	keyfoldv1.RegisterClusterServer(s, &clusterServer{b: b, api: &server{opts: Options{Logger: logger}}})
}

type clusterServer struct {
	keyfoldv1.UnimplementedClusterServer
	b   LocalBackend
	api *server // encodes states and errors as the public API does
}

// Forward submits every batch in order, then waits for each.
func (c *clusterServer) Forward(ctx context.Context, req *keyfoldv1.ForwardRequest) (*keyfoldv1.ForwardResponse, error) {
	results := make([]*keyfoldv1.ForwardResult, len(req.Batches))
	pending := make([]actors.Pending, len(req.Batches))
	for i, b := range req.Batches {
		p, err := c.b.SubmitLocal(ctx, req.From, b)
		if err != nil {
			results[i] = c.failed(err)
			continue
		}
		pending[i] = p
	}
	for i, p := range pending {
		if p == nil {
			continue
		}
		r, err := p.Wait(ctx)
		if err != nil {
			results[i] = c.failed(err)
			continue
		}
		results[i] = &keyfoldv1.ForwardResult{Accepted: uint32(r.Accepted), Duplicates: uint32(r.Duplicates)}
	}
	return &keyfoldv1.ForwardResponse{Results: results}, nil
}

func (c *clusterServer) failed(err error) *keyfoldv1.ForwardResult {
	return &keyfoldv1.ForwardResult{Error: c.api.batchError(err), Refused: errors.Is(err, actors.ErrNotServed)}
}

func (c *clusterServer) GetState(ctx context.Context, req *keyfoldv1.GetStateRequest) (*keyfoldv1.GetStateResponse, error) {
	resp, err := c.b.QueryLocal(ctx, req.Pipeline, req.Key)
	if err != nil {
		return nil, c.status(err)
	}
	return resp, nil
}

func (c *clusterServer) DeleteKey(ctx context.Context, req *keyfoldv1.DeleteKeyRequest) (*keyfoldv1.DeleteKeyResponse, error) {
	if err := c.b.DeleteLocal(ctx, req.Pipeline, req.Key); err != nil {
		return nil, c.status(err)
	}
	return &keyfoldv1.DeleteKeyResponse{}, nil
}

// Call answers the handler's failure of the call in the response, so that
// the sender tells it from a failure to call.
func (c *clusterServer) Call(ctx context.Context, req *keyfoldv1.CallRequest) (*keyfoldv1.ForwardCallResponse, error) {
	r, err := c.b.CallLocal(ctx, req)
	if err != nil && !errors.Is(err, fold.ErrCallFailed) {
		return nil, c.status(err)
	}
	return &keyfoldv1.ForwardCallResponse{Reply: &keyfoldv1.CallResponse{Reply: r.Value, Duplicate: r.Duplicate}, Error: r.Err}, nil
}

func (c *clusterServer) Status(ctx context.Context, _ *keyfoldv1.NodeStatusRequest) (*keyfoldv1.NodeStatus, error) {
	return c.b.Status(ctx), nil
}

// status is the public API's status of err, except that a call for a
// group another node owns is FAILED_PRECONDITION: the sender routes it
// again.
func (c *clusterServer) status(err error) error {
	if errors.Is(err, actors.ErrNotOwner) || errors.Is(err, actors.ErrNotServed) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return c.api.status(err)
}

func (c *clusterServer) MembersChanged(_ context.Context, req *keyfoldv1.MembersChangedRequest) (*keyfoldv1.MembersChangedResponse, error) {
	c.b.MembersChanged(req.From, req.Leaving)
	return &keyfoldv1.MembersChangedResponse{}, nil
}

func (c *clusterServer) Released(_ context.Context, req *keyfoldv1.ReleasedRequest) (*keyfoldv1.ReleasedResponse, error) {
	c.b.Released(req.From, req.Groups)
	return &keyfoldv1.ReleasedResponse{}, nil
}
