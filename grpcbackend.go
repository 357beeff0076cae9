package keyfold

import (
	"context"

	"github.com/keyfold/keyfold/actors"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi"
)

// grpcBackend adapts a Node to the gRPC API.
type grpcBackend struct{ n *Node }

var _ grpcapi.Backend = grpcBackend{}

func (b grpcBackend) Ingest(ctx context.Context, pipeline string, events [][]byte) (IngestResult, error) {
	p, err := b.Submit(ctx, pipeline, events)
	if err != nil {
		return IngestResult{}, err
	}
	return p.Wait(ctx)
}

func (b grpcBackend) Submit(ctx context.Context, pipeline string, events [][]byte) (PendingIngest, error) {
	return b.n.SubmitIngest(ctx, pipeline, events)
}

func (b grpcBackend) Query(ctx context.Context, pipeline, key string) (*keyfoldv1.GetStateResponse, error) {
	v, err := b.n.query(ctx, pipeline, key)
	if err != nil {
		return nil, err
	}
	return b.n.stateResponse(pipeline, key, v)
}

func (b grpcBackend) Delete(ctx context.Context, pipeline, key string) error {
	return b.n.Delete(ctx, pipeline, key)
}

func (b grpcBackend) Call(ctx context.Context, req *keyfoldv1.CallRequest) (*keyfoldv1.CallResponse, error) {
	r, err := b.n.Call(ctx, req.Pipeline, req.Key, req.Request, CallOptions{ID: req.Id, ReadOnly: req.ReadOnly})
	if err != nil {
		return nil, err
	}
	return &keyfoldv1.CallResponse{Reply: r.Reply, Duplicate: r.Duplicate}, nil
}

func (b grpcBackend) Pipelines() []*keyfoldv1.PipelineInfo { return b.n.describePipelines() }

func (b grpcBackend) Joins() []*keyfoldv1.JoinInfo { return b.n.describeJoins() }

func (b grpcBackend) Outputs(ctx context.Context, pipeline, after string, limit int) ([]*keyfoldv1.OutputEntry, error) {
	outs, err := b.n.storedOutputs(ctx, pipeline, after, limit)
	if err != nil {
		return nil, err
	}
	page := make([]*keyfoldv1.OutputEntry, len(outs))
	for i, o := range outs {
		page[i] = outputEntry(o)
	}
	return page, nil
}

// Subscribe follows the outputs; a draining node ends the stream with
// ErrClosed (Unavailable: clients resume elsewhere or after the restart)
// instead of holding its shutdown.
func (b grpcBackend) Subscribe(ctx context.Context, pipeline, after string, fn func(*keyfoldv1.OutputEntry) error) error {
	return b.n.subscribe(ctx, pipeline, after, func(o actors.Output) error { return fn(outputEntry(o)) })
}

// outputEntry is the API's form of an output: the stored message itself.
func outputEntry(o actors.Output) *keyfoldv1.OutputEntry {
	return &keyfoldv1.OutputEntry{Cursor: o.Cursor, Output: o.Output, StoredMs: o.Time.UnixMilli()}
}

func (b grpcBackend) Cluster(ctx context.Context, pipeline, key string) (*keyfoldv1.GetClusterResponse, error) {
	info, err := b.n.Cluster(ctx, pipeline, key)
	if err != nil {
		return nil, err
	}
	resp := &keyfoldv1.GetClusterResponse{Cluster: info.Cluster, Self: info.Self, KeyGroups: info.KeyGroups,
		Membership: info.Membership, FailureDetection: info.FailureDetection, Members: make([]*keyfoldv1.ClusterMember, len(info.Members))}
	for i, m := range info.Members {
		resp.Members[i] = &keyfoldv1.ClusterMember{
			Id: m.ID, State: m.State, Error: m.Error, GroupsAssigned: uint32(m.GroupsAssigned), GroupsOwned: m.GroupsOwned,
			GroupsServing: m.GroupsServing, ActiveKeys: m.ActiveKeys, Events: m.Events, EventsForwarded: m.EventsForwarded,
			EventsReceived: m.EventsReceived, HttpAddr: m.HTTPAddr,
		}
		if !m.Started.IsZero() {
			resp.Members[i].StartedMs = m.Started.UnixMilli()
		}
	}
	if k := info.Key; k != nil {
		resp.Key = &keyfoldv1.KeyOwner{Pipeline: k.Pipeline, Key: k.Key, Group: k.Group, Owner: k.Owner}
	}
	return resp, nil
}
