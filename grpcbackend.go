package keyfold

import (
	"context"

	"github.com/keyfold/keyfold/cluster"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi"
)

// grpcBackend adapts a Node to the gRPC API.
type grpcBackend struct{ n *Node }

var _ grpcapi.Backend = grpcBackend{}

func (b grpcBackend) Ingest(ctx context.Context, pipeline string, events [][]byte) (int, int, error) {
	p, err := b.Submit(ctx, pipeline, events)
	if err != nil {
		return 0, 0, err
	}
	return p.Wait(ctx)
}

func (b grpcBackend) Submit(ctx context.Context, pipeline string, events [][]byte) (grpcapi.Pending, error) {
	p, err := b.n.SubmitIngest(ctx, pipeline, events)
	if err != nil {
		return nil, err
	}
	return grpcPending{p}, nil
}

type grpcPending struct{ p *PendingIngest }

func (p grpcPending) Wait(ctx context.Context) (int, int, error) {
	r, err := p.p.Wait(ctx)
	return r.Accepted, r.Duplicates, err
}

func (b grpcBackend) Query(ctx context.Context, pipeline, key string) (grpcapi.KeyState, error) {
	st, err := b.n.Query(ctx, pipeline, key)
	return grpcState(st), err
}

// grpcState is a key's state as the gRPC API takes it.
func grpcState(st KeyState) grpcapi.KeyState {
	ks := grpcapi.KeyState{Seq: st.Seq, Duplicates: st.Duplicates, Aggregates: st.Aggregates, State: st.State}
	if st.HandlerFailures != nil {
		ks.HandlerFailures = *st.HandlerFailures
	}
	if st.Late != nil { // a pipeline with windows or patterns
		ks.Time = cluster.TimeState{Watermark: st.Watermark, Late: st.Late, Windows: st.Windows, Patterns: st.Patterns, LateWindows: st.LateWindows}
	}
	return ks
}

func (b grpcBackend) Delete(ctx context.Context, pipeline, key string) error {
	return b.n.Delete(ctx, pipeline, key)
}

func (b grpcBackend) Pipelines() []*keyfoldv1.PipelineInfo { return b.n.describePipelines() }

func (b grpcBackend) Outputs(ctx context.Context, pipeline, after string, limit int) ([]*keyfoldv1.OutputEntry, error) {
	outs, err := b.n.Outputs(ctx, pipeline, after, limit)
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
	return b.n.Subscribe(ctx, pipeline, after, func(o Output) error { return fn(outputEntry(o)) })
}

// outputEntry is the API's form of an output.
func outputEntry(o Output) *keyfoldv1.OutputEntry {
	return &keyfoldv1.OutputEntry{
		Cursor: o.Cursor,
		Output: &keyfoldv1.Output{
			Id: o.ID, Pipeline: o.Pipeline, Key: o.Key, Kind: o.Kind, Name: o.Name,
			StartMs: o.Start.UnixMilli(), EndMs: o.End.UnixMilli(), Revision: o.Revision, Count: o.Count,
			ValuesJson: o.Values, WatermarkMs: o.Watermark.UnixMilli(), Supersedes: o.Supersedes,
		},
		StoredMs: o.Stored.UnixMilli(),
	}
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
