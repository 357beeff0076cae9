package keyfold

import (
	"context"
	"encoding/json"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/httpapi"
)

// httpBackend adapts a Node to the HTTP API.
type httpBackend struct{ n *Node }

var _ httpapi.Backend = httpBackend{}

func (b httpBackend) Ingest(ctx context.Context, pipeline string, events []json.RawMessage) (IngestResult, error) {
	return b.n.Ingest(ctx, pipeline, events)
}

func (b httpBackend) Query(ctx context.Context, pipeline, key string) (any, error) {
	return b.n.Query(ctx, pipeline, key)
}

func (b httpBackend) Delete(ctx context.Context, pipeline, key string) error {
	return b.n.Delete(ctx, pipeline, key)
}

func (b httpBackend) Call(ctx context.Context, pipeline, key string, req httpapi.CallRequest) (any, error) {
	return b.n.Call(ctx, pipeline, key, req.Request, CallOptions{ID: req.ID, ReadOnly: req.ReadOnly})
}

func (b httpBackend) Outputs(ctx context.Context, pipeline, after string, limit int) ([]httpapi.Output, error) {
	outs, err := b.n.Outputs(ctx, pipeline, after, limit)
	if err != nil {
		return nil, err
	}
	page := make([]httpapi.Output, len(outs))
	for i, o := range outs {
		page[i] = httpapi.Output{Cursor: o.Cursor, Value: o}
	}
	return page, nil
}

func (b httpBackend) Subscribe(ctx context.Context, pipeline, after string, fn func(httpapi.Output) error) error {
	return b.n.Subscribe(ctx, pipeline, after, func(o Output) error {
		return fn(httpapi.Output{Cursor: o.Cursor, Value: o})
	})
}

func (b httpBackend) Pipelines() []*keyfoldv1.PipelineInfo { return b.n.describePipelines() }

func (b httpBackend) Joins() []*keyfoldv1.JoinInfo { return b.n.describeJoins() }

func (b httpBackend) Serving() bool { return b.n.Serving() }

func (b httpBackend) Cluster(ctx context.Context, pipeline, key string) (any, error) {
	return b.n.Cluster(ctx, pipeline, key)
}
