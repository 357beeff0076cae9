package grpcapi

import (
	"context"
	"fmt"

	"google.golang.org/grpc/status"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services"
)

// Outputs over gRPC: ListOutputs reads a page, Subscribe streams. Both mirror
// the HTTP API's GET …/outputs and …/outputs/stream.

// Page sizes of ListOutputs.
const (
	DefaultOutputsLimit = 100
	MaxOutputsLimit     = 10_000
)

// requestError is a request field refused before the backend is called.
// It is an InvalidArgument with a BadRequest detail naming the field.
type requestError struct {
	field  string
	reason string // a sentence about the field, naming it
}

func (e *requestError) Error() string { return "grpcapi: " + e.reason }

func (e *requestError) Unwrap() error { return services.ErrBadRequest }

// checkPipeline refuses an empty pipeline name.
func checkPipeline(pipeline string) error {
	if pipeline == "" {
		return &requestError{field: "pipeline", reason: "pipeline is required"}
	}
	return nil
}

func (s *server) ListOutputs(ctx context.Context, req *keyfoldv1.ListOutputsRequest) (*keyfoldv1.ListOutputsResponse, error) {
	if err := checkPipeline(req.Pipeline); err != nil {
		return nil, s.status(err)
	}
	limit := int(req.Limit)
	switch {
	case limit == 0:
		limit = DefaultOutputsLimit
	case limit > MaxOutputsLimit:
		return nil, s.status(&requestError{field: "limit",
			reason: fmt.Sprintf("limit must be at most %d (got %d)", MaxOutputsLimit, req.Limit)})
	}
	outs, err := s.b.Outputs(ctx, req.Pipeline, req.After, limit)
	if err != nil {
		return nil, s.status(err)
	}
	resp := &keyfoldv1.ListOutputsResponse{Outputs: outs, Next: req.After}
	if len(outs) > 0 {
		resp.Next = outs[len(outs)-1].Cursor
	}
	return resp, nil
}

// Subscribe checks the pipeline and the cursor (so that a bad one is a
// plain error status), sends the response headers (the client then knows
// it is subscribed), and streams until the client goes away. Each Send
// waits for flow control, so a slow client holds the backend's reading
// back instead of filling memory.
func (s *server) Subscribe(req *keyfoldv1.SubscribeRequest, stream keyfoldv1.Keyfold_SubscribeServer) error {
	if err := checkPipeline(req.Pipeline); err != nil {
		return s.status(err)
	}
	ctx := stream.Context()
	if _, err := s.b.Outputs(ctx, req.Pipeline, req.After, 1); err != nil {
		return s.status(err)
	}
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	err := s.b.Subscribe(ctx, req.Pipeline, req.After, stream.Send)
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case err == nil:
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err // Send's: the transport's own status
	}
	return s.status(err)
}
