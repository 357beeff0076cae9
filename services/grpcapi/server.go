// Package grpcapi serves keyfold's gRPC API (service keyfold.v1.Keyfold,
// proto/keyfold/v1/service.proto) over a Backend, which the keyfold package
// implements with its Node. It holds no logic of its own: validation,
// logging and state are the node's; errors map to codes through the table
// both APIs share (services.StatusOf).
package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services"
)

// Backend is what the API serves.
type Backend interface {
	// Ingest validates, logs and applies a batch of events of one pipeline.
	Ingest(ctx context.Context, pipeline string, events [][]byte) (actors.Result, error)
	// Submit validates a batch and queues it for logging without waiting:
	// batches submitted one after the other are applied in that order.
	Submit(ctx context.Context, pipeline string, events [][]byte) (actors.Pending, error)
	// Query returns one key's state, encoded (cluster.StateResponse).
	Query(ctx context.Context, pipeline, key string) (*keyfoldv1.GetStateResponse, error)
	// Delete erases one key.
	Delete(ctx context.Context, pipeline, key string) error
	// Call calls one key's Go handler.
	Call(ctx context.Context, req *keyfoldv1.CallRequest) (*keyfoldv1.CallResponse, error)
	// Pipelines describes the configured pipelines.
	Pipelines() []*keyfoldv1.PipelineInfo
	// Joins describes the configured joins.
	Joins() []*keyfoldv1.JoinInfo
	// Outputs returns up to limit results of a pipeline stored after
	// cursor after ("" from the oldest kept), oldest first.
	Outputs(ctx context.Context, pipeline, after string, limit int) ([]*keyfoldv1.OutputEntry, error)
	// Subscribe calls fn with each result of a pipeline stored after cursor
	// after, then with each new one as it is stored, until ctx ends (it
	// then returns nil), fn fails (it returns fn's error) or the backend
	// stops serving (a draining node: an error that maps to Unavailable).
	Subscribe(ctx context.Context, pipeline, after string, fn func(*keyfoldv1.OutputEntry) error) error
	// Cluster describes the cluster as this node sees it, with the owner of
	// pipeline's key if key is set.
	Cluster(ctx context.Context, pipeline, key string) (*keyfoldv1.GetClusterResponse, error)
}

// Options configures the service.
type Options struct {
	// MaxConcurrentIngests bounds the batches being processed at once,
	// unary calls and stream batches together (default 64); more wait
	// for a slot, a stream by not reading further.
	MaxConcurrentIngests int
	// StreamWindow bounds the batches a stream may have in flight, read
	// but not yet acknowledged (default 8).
	StreamWindow int
	// MaxBatchEvents bounds the events of one batch (default
	// services.DefaultMaxBatchEvents); a larger one is InvalidArgument.
	MaxBatchEvents int
	// Budget bounds the memory of the batches in flight (their events'
	// bytes and services.EventCost per event); a batch that does not fit is
	// ResourceExhausted, with a RetryInfo. The node shares one with the
	// HTTP API; nil makes one of services.DefaultMaxIngestBytes.
	Budget *services.Budget
	// Logger receives internal errors; nil discards.
	Logger *slog.Logger
}

// Register registers the service on s.
func Register(s grpc.ServiceRegistrar, b Backend, opts Options) {
	if opts.MaxConcurrentIngests <= 0 {
		opts.MaxConcurrentIngests = 64
	}
	if opts.StreamWindow <= 0 {
		opts.StreamWindow = 8
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxBatchEvents <= 0 {
		opts.MaxBatchEvents = services.DefaultMaxBatchEvents
	}
	if opts.Budget == nil {
		opts.Budget = services.NewBudget(services.DefaultMaxIngestBytes)
	}
	keyfoldv1.RegisterKeyfoldServer(s, &server{b: b, opts: opts, slots: make(chan struct{}, opts.MaxConcurrentIngests)})
}

type server struct {
	keyfoldv1.UnimplementedKeyfoldServer
	b     Backend
	opts  Options
	slots chan struct{}
}

// acquire takes an ingest slot, waiting until ctx ends.
func (s *server) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", services.ErrBusy, ctx.Err())
	}
}

func (s *server) release() { <-s.slots }

// admit checks a batch's size and reserves its cost in the budget; the
// caller releases the cost once the batch is done.
func (s *server) admit(events [][]byte) (cost int64, err error) {
	if len(events) > s.opts.MaxBatchEvents {
		return 0, services.BatchTooLarge(len(events), s.opts.MaxBatchEvents)
	}
	cost = int64(len(events)) * services.EventCost
	for _, e := range events {
		cost += int64(len(e))
	}
	if err := s.opts.Budget.Reserve(cost); err != nil {
		return 0, err
	}
	return cost, nil
}

func (s *server) Ingest(ctx context.Context, req *keyfoldv1.IngestRequest) (*keyfoldv1.IngestResponse, error) {
	cost, err := s.admit(req.Events)
	if err != nil {
		return nil, s.status(err)
	}
	defer s.opts.Budget.Release(cost)
	if err := s.acquire(ctx); err != nil {
		return nil, s.status(err)
	}
	defer s.release()
	r, err := s.b.Ingest(ctx, req.Pipeline, req.Events)
	if err != nil {
		return nil, s.status(err)
	}
	return &keyfoldv1.IngestResponse{Accepted: uint32(r.Accepted), Duplicates: uint32(r.Duplicates)}, nil
}

// IngestStream reads batches, submits each in order and acknowledges each
// in order once durable. At most StreamWindow+2 batches are read ahead of
// their acks (the window, the one being acknowledged, one waiting for
// room; each holds an ingest slot): then the server stops reading and
// HTTP/2 flow control holds the client back.
func (s *server) IngestStream(stream keyfoldv1.Keyfold_IngestStreamServer) error {
	ctx := stream.Context()
	type inFlight struct {
		id   uint64
		p    actors.Pending
		err  error
		cost int64 // reserved in the budget
	}
	window := make(chan inFlight, s.opts.StreamWindow)
	ackerDone := make(chan struct{})
	var sendErr error
	go func() {
		defer close(ackerDone)
		for f := range window {
			resp := &keyfoldv1.IngestStreamResponse{BatchId: f.id}
			err := f.err
			if err == nil {
				var r actors.Result
				r, err = f.p.Wait(ctx)
				resp.Accepted, resp.Duplicates = uint32(r.Accepted), uint32(r.Duplicates)
			}
			s.release()
			s.opts.Budget.Release(f.cost)
			if err != nil {
				resp.Accepted, resp.Duplicates = 0, 0
				resp.Error = s.batchError(err)
			}
			if sendErr == nil {
				sendErr = stream.Send(resp)
			}
			// After a failed send, keep draining so the reader never blocks.
		}
	}()
	var recvErr error
	for {
		req, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				recvErr = err
			}
			break
		}
		if err := s.acquire(ctx); err != nil {
			recvErr = err
			break
		}
		cost, err := s.admit(req.Events)
		if err != nil { // this batch's ack says why; the stream goes on
			window <- inFlight{id: req.BatchId, err: err}
			continue
		}
		p, err := s.b.Submit(ctx, req.Pipeline, req.Events)
		window <- inFlight{id: req.BatchId, p: p, err: err, cost: cost}
	}
	close(window)
	<-ackerDone
	switch {
	case sendErr != nil:
		return sendErr
	case recvErr != nil:
		if _, ok := status.FromError(recvErr); ok {
			return recvErr // the transport's own status (cancelled, too large…)
		}
		return s.status(recvErr)
	}
	return nil
}

func (s *server) GetState(ctx context.Context, req *keyfoldv1.GetStateRequest) (*keyfoldv1.GetStateResponse, error) {
	resp, err := s.b.Query(ctx, req.Pipeline, req.Key)
	if err != nil {
		return nil, s.status(err)
	}
	return resp, nil
}

func (s *server) DeleteKey(ctx context.Context, req *keyfoldv1.DeleteKeyRequest) (*keyfoldv1.DeleteKeyResponse, error) {
	if err := s.b.Delete(ctx, req.Pipeline, req.Key); err != nil {
		return nil, s.status(err)
	}
	return &keyfoldv1.DeleteKeyResponse{}, nil
}

// Call takes an ingest slot, as an ingest does: it is logged like one.
func (s *server) Call(ctx context.Context, req *keyfoldv1.CallRequest) (*keyfoldv1.CallResponse, error) {
	if err := s.acquire(ctx); err != nil {
		return nil, s.status(err)
	}
	defer s.release()
	resp, err := s.b.Call(ctx, req)
	if err != nil {
		return nil, s.status(err)
	}
	return resp, nil
}

func (s *server) GetCluster(ctx context.Context, req *keyfoldv1.GetClusterRequest) (*keyfoldv1.GetClusterResponse, error) {
	resp, err := s.b.Cluster(ctx, req.Pipeline, req.Key)
	if err != nil {
		return nil, s.status(err)
	}
	return resp, nil
}

func (s *server) ListPipelines(context.Context, *keyfoldv1.ListPipelinesRequest) (*keyfoldv1.ListPipelinesResponse, error) {
	return &keyfoldv1.ListPipelinesResponse{Pipelines: s.b.Pipelines(), Joins: s.b.Joins()}, nil
}

// status turns an error into a gRPC status: the code from the shared table,
// the public message, a BadRequest detail naming the event and field of an
// invalid batch (or the refused request field), and a RetryInfo detail on
// the retryable codes.
func (s *server) status(err error) error {
	st := services.StatusOf(err)
	if st.HTTP >= 500 && !st.Retryable() {
		s.opts.Logger.Error("gRPC call failed", "err", err)
	}
	out := status.New(st.GRPC, services.PublicMessage(err))
	var details []protoadapt.MessageV1
	if index, field, reason, ok := invalidEvent(err); ok {
		name := fmt.Sprintf("events[%d]", index)
		if index < 0 {
			name = "events"
		}
		if field != "" {
			name += "." + field
		}
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: name, Description: reason},
		}})
	}
	var re *requestError
	if errors.As(err, &re) {
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: re.field, Description: re.reason},
		}})
	}
	if st.Retryable() {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	}
	if withD, err := out.WithDetails(details...); err == nil {
		out = withD
	}
	return out.Err()
}

// batchError is a stream batch's failure.
func (s *server) batchError(err error) *keyfoldv1.BatchError {
	be := &keyfoldv1.BatchError{Code: int32(services.StatusOf(err).GRPC), Message: services.PublicMessage(err), EventIndex: -1}
	if index, field, _, ok := invalidEvent(err); ok {
		be.EventIndex, be.Field = int32(index), field
	}
	return be
}

// invalidEvent tells which event and field made a batch invalid.
func invalidEvent(err error) (index int, field, reason string, ok bool) {
	var be *fold.BatchError
	var fe *fold.FieldError
	switch {
	case errors.As(err, &be):
		index = be.Index
		if errors.As(be.Err, &fe) {
			return index, fe.Field, fe.Reason, true
		}
		return index, "", be.Err.Error(), true
	case errors.As(err, &fe):
		return -1, fe.Field, fe.Reason, true
	}
	return 0, "", "", false
}
