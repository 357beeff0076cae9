// Package client is the Go client of keyfold's gRPC API.
//
//	c, err := client.Dial("localhost:9090")
//	res, err := c.Ingest(ctx, "logins", events) // each event a JSON object
//	st, err := c.GetState(ctx, "logins", "alice")
//	err = c.Subscribe(ctx, "logins", cursor, fn) // window results, live
//
// Deadlines come from the context. Ingest retries what failed in a way that
// may succeed later (Unavailable, ResourceExhausted, DeadlineExceeded of one
// attempt, a dropped connection) with backoff, as the server's RetryInfo
// suggests: that is safe for events that carry their pipeline's id field,
// which are applied once however often they are sent. Events without ids
// may be counted twice by a retry; set MaxRetries to 0 for those.
// Subscribe resumes a broken stream of results from the last one it
// delivered, until its context ends.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Client calls one keyfold node (or a load balancer in front of several).
// It is safe for concurrent use.
type Client struct {
	conn  *grpc.ClientConn
	owned bool
	api   keyfoldv1.KeyfoldClient
	opts  Options
}

// Options configures a Client. The zero value is a sane default.
type Options struct {
	// MaxRetries is how many times Ingest resends a batch after a
	// retryable failure (default 5; negative: never).
	MaxRetries int
	// AttemptTimeout bounds one attempt of Ingest when the context has a
	// later deadline or none (default 30 s).
	AttemptTimeout time.Duration
	// TLS, if set, secures the connection; Dial uses plaintext otherwise.
	TLS credentials.TransportCredentials
	// DialOptions are added to Dial's.
	DialOptions []grpc.DialOption
}

func (o Options) withDefaults() Options {
	switch {
	case o.MaxRetries == 0:
		o.MaxRetries = 5
	case o.MaxRetries < 0:
		o.MaxRetries = 0
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 30 * time.Second
	}
	return o
}

// Dial returns a client of the node at target (host:port, or any gRPC
// target). It does not wait for the connection.
func Dial(target string, opts Options) (*Client, error) {
	opts = opts.withDefaults()
	dial := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20))}
	if opts.TLS != nil {
		dial = append(dial, grpc.WithTransportCredentials(opts.TLS))
	} else {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
				return explainPlaintext(invoker(ctx, method, req, reply, cc, o...))
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
				s, err := streamer(ctx, desc, cc, method, o...)
				return s, explainPlaintext(err)
			}))
	}
	conn, err := grpc.NewClient(target, append(dial, opts.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("keyfold client: %w", err)
	}
	return &Client{conn: conn, owned: true, api: keyfoldv1.NewKeyfoldClient(conn), opts: opts}, nil
}

// explainPlaintext adds the likely cause to the error of a plaintext call
// that a node serving TLS cut before its HTTP/2 preface: gRPC reports only
// "error reading server preface: EOF".
func explainPlaintext(err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "server preface") {
		return err
	}
	return status.Error(codes.Unavailable, st.Message()+
		" (the node may serve TLS while this client speaks plaintext: connect with TLS, e.g. keyfold's --tls or --tls-ca)")
}

// New returns a client over an existing connection, which Close leaves open.
func New(conn *grpc.ClientConn, opts Options) *Client {
	return &Client{conn: conn, api: keyfoldv1.NewKeyfoldClient(conn), opts: opts.withDefaults()}
}

// Close closes the connection if Dial made it.
func (c *Client) Close() error {
	if !c.owned {
		return nil
	}
	return c.conn.Close()
}

// Result is the outcome of an ingested batch.
type Result struct {
	Accepted   int // events applied
	Duplicates int // events whose id the key had already applied
}

// Ingest sends a batch of events (each a JSON object) and returns once all
// are durable, retrying as the package documentation says.
func (c *Client) Ingest(ctx context.Context, pipeline string, events [][]byte) (Result, error) {
	req := &keyfoldv1.IngestRequest{Pipeline: pipeline, Events: events}
	var err error
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
		var resp *keyfoldv1.IngestResponse
		resp, err = c.api.Ingest(actx, req)
		cancel()
		if err == nil {
			return Result{Accepted: int(resp.Accepted), Duplicates: int(resp.Duplicates)}, nil
		}
		if attempt >= c.opts.MaxRetries || !Retryable(err) || ctx.Err() != nil {
			return Result{}, wrap(err)
		}
		wait := backoff(attempt, err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return Result{}, wrap(err)
		}
	}
}

// Retryable reports whether a call that failed with err may succeed when
// sent again unchanged. ResourceExhausted is, when the server says when to
// retry (an overloaded node); a message over the size limit is not.
func Retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	case codes.ResourceExhausted:
		return retryInfo(err) > 0
	}
	return false
}

// retryInfo is the delay a RetryInfo detail of err asks for, 0 if none.
func retryInfo(err error) time.Duration {
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok && ri.RetryDelay != nil {
				return max(ri.RetryDelay.AsDuration(), time.Millisecond)
			}
		}
	}
	return 0
}

// backoff is the wait before attempt+1: the server's RetryInfo if it gave
// one, else exponential from 50 ms, at most 5 s.
func backoff(attempt int, err error) time.Duration {
	if d := retryInfo(err); d > 0 {
		return min(d, 5*time.Second)
	}
	return min(50*time.Millisecond<<min(attempt, 7), 5*time.Second)
}

// Error is a failed call: its gRPC code and message and, for an invalid
// batch, the event and field at fault.
type Error struct {
	Code       codes.Code
	Message    string
	EventIndex int    // -1 if the error is not about one event
	Field      string // the offending field (of the event, else of the request), "" if none
	err        error
}

func (e *Error) Error() string { return fmt.Sprintf("keyfold: %s: %s", e.Code, e.Message) }

// Unwrap returns the gRPC status error.
func (e *Error) Unwrap() error { return e.err }

// GRPCStatus lets status.FromError and status.Code see the code.
func (e *Error) GRPCStatus() *status.Status { s, _ := status.FromError(e.err); return s }

func wrap(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), EventIndex: -1, err: err}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 {
			e.EventIndex, e.Field = parseViolation(br.FieldViolations[0].Field)
		}
	}
	return e
}

// parseViolation reads "events[3].amount" (or "events[3]"), or the name
// of a request field ("pipeline", "limit").
func parseViolation(f string) (int, string) {
	if !strings.HasPrefix(f, "events") {
		return -1, f
	}
	var i int
	var rest string
	if n, _ := fmt.Sscanf(f, "events[%d]%s", &i, &rest); n >= 1 {
		if len(rest) > 0 && rest[0] == '.' {
			rest = rest[1:]
		}
		return i, rest
	}
	return -1, ""
}

// State is one key's state.
type State struct {
	Pipeline   string
	Key        string
	Seq        uint64         // events applied
	Duplicates uint64         // events skipped: their id was already applied
	Aggregates map[string]any // JSON values: float64, string, nil, objects
	// Time is, for a pipeline with windows or patterns, the key's
	// watermark, late count, windows and patterns as the HTTP API shows
	// them (a JSON object); nil otherwise.
	Time json.RawMessage
}

// GetState returns a key's state; a key without state is an *Error with
// code NotFound.
func (c *Client) GetState(ctx context.Context, pipeline, key string) (*State, error) {
	resp, err := c.api.GetState(ctx, &keyfoldv1.GetStateRequest{Pipeline: pipeline, Key: key})
	if err != nil {
		return nil, wrap(err)
	}
	st := &State{Pipeline: resp.Pipeline, Key: resp.Key, Seq: resp.Seq, Duplicates: resp.Duplicates, Aggregates: make(map[string]any, len(resp.Aggregates))}
	for name, raw := range resp.Aggregates {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("keyfold client: aggregate %q: %w", name, err)
		}
		st.Aggregates[name] = v
	}
	if len(resp.TimeJson) > 0 {
		st.Time = json.RawMessage(resp.TimeJson)
	}
	return st, nil
}

// Call sends request (a JSON value) to a key's Go handler and returns its
// reply (a JSON value) and whether it was kept from an earlier call with
// the same id. id ("" for none) makes it exactly-once; readOnly runs it
// without logging it (it takes no id). The handler's failure is an *Error
// with code FailedPrecondition and the handler's text; the key is then
// unchanged. A call that failed Unavailable may have been applied: retry
// it with the same id.
func (c *Client) Call(ctx context.Context, pipeline, key string, request []byte, id string, readOnly bool) (reply json.RawMessage, duplicate bool, err error) {
	resp, err := c.api.Call(ctx, &keyfoldv1.CallRequest{Pipeline: pipeline, Key: key, Request: request, Id: id, ReadOnly: readOnly})
	if err != nil {
		return nil, false, wrap(err)
	}
	return resp.Reply, resp.Duplicate, nil
}

// DeleteKey erases a key's state (durably, when it returns).
func (c *Client) DeleteKey(ctx context.Context, pipeline, key string) error {
	if _, err := c.api.DeleteKey(ctx, &keyfoldv1.DeleteKeyRequest{Pipeline: pipeline, Key: key}); err != nil {
		return wrap(err)
	}
	return nil
}

// Ready returns nil if the node is ready (the standard gRPC health service
// answers SERVING: recovered, serving its share of the key groups, not
// draining), else why not.
func (c *Client) Ready(ctx context.Context) error {
	resp, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return wrap(err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("keyfold client: node health is %s", resp.Status)
	}
	return nil
}

// Pipelines lists the node's pipelines.
func (c *Client) Pipelines(ctx context.Context) ([]*keyfoldv1.PipelineInfo, error) {
	resp, err := c.api.ListPipelines(ctx, &keyfoldv1.ListPipelinesRequest{})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.Pipelines, nil
}

// Joins lists the node's joins (ListPipelines' joins).
func (c *Client) Joins(ctx context.Context) ([]*keyfoldv1.JoinInfo, error) {
	resp, err := c.api.ListPipelines(ctx, &keyfoldv1.ListPipelinesRequest{})
	if err != nil {
		return nil, wrap(err)
	}
	return resp.Joins, nil
}

// Cluster describes the cluster as the node sees it: its members and
// their key groups, and, if key is set, the member that owns pipeline's
// key (pipeline may be "" when the node has one).
func (c *Client) Cluster(ctx context.Context, pipeline, key string) (*keyfoldv1.GetClusterResponse, error) {
	resp, err := c.api.GetCluster(ctx, &keyfoldv1.GetClusterRequest{Pipeline: pipeline, Key: key})
	if err != nil {
		return nil, wrap(err)
	}
	return resp, nil
}

// ErrStreamBroken is the outcome of a batch whose stream ended before its
// ack: whether it was applied is not known, so send it again (safe with
// ids).
var ErrStreamBroken = errors.New("keyfold client: the stream ended before the batch's ack")

// Stream sends batches of one pipeline over one IngestStream and reports
// each batch's outcome when the node acknowledges it (durable) or fails it.
// Send and Close must not be called concurrently.
type Stream struct {
	pipeline string
	s        grpc.BidiStreamingClient[keyfoldv1.IngestStreamRequest, keyfoldv1.IngestStreamResponse]
	cancel   context.CancelFunc

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]func(Result, error) // by batch id
	slots   chan struct{}                  // bounds the batches awaiting acks
	done    chan struct{}                  // closed when the receiver stopped
	err     error                          // why the stream broke
}

// Stream opens a stream of batches of pipeline. At most window batches
// (default 16) await their acks; Send blocks beyond that.
func (c *Client) Stream(ctx context.Context, pipeline string, window int) (*Stream, error) {
	if window <= 0 {
		window = 16
	}
	sctx, cancel := context.WithCancel(ctx)
	s, err := c.api.IngestStream(sctx)
	if err != nil {
		cancel()
		return nil, wrap(err)
	}
	st := &Stream{pipeline: pipeline, s: s, cancel: cancel, waiting: map[uint64]func(Result, error){},
		slots: make(chan struct{}, window), done: make(chan struct{})}
	go st.receive()
	return st, nil
}

func (st *Stream) receive() {
	defer close(st.done)
	for {
		resp, err := st.s.Recv()
		if err != nil {
			st.mu.Lock()
			if st.err == nil {
				st.err = wrap(err)
			}
			waiting := st.waiting
			st.waiting = nil
			st.mu.Unlock()
			for _, done := range waiting {
				done(Result{}, fmt.Errorf("%w: %w", ErrStreamBroken, st.err))
				<-st.slots
			}
			return
		}
		st.mu.Lock()
		done := st.waiting[resp.BatchId]
		delete(st.waiting, resp.BatchId)
		st.mu.Unlock()
		if done == nil {
			continue
		}
		<-st.slots
		if resp.Error != nil {
			err := &Error{Code: codes.Code(resp.Error.Code), Message: resp.Error.Message, EventIndex: int(resp.Error.EventIndex), Field: resp.Error.Field,
				err: status.Error(codes.Code(resp.Error.Code), resp.Error.Message)}
			done(Result{}, err)
			continue
		}
		done(Result{Accepted: int(resp.Accepted), Duplicates: int(resp.Duplicates)}, nil)
	}
}

// Send queues a batch; done is called, from the stream's receiving
// goroutine, with its outcome. It blocks while the window is full, and
// fails if the stream broke (then done is not called).
func (st *Stream) Send(events [][]byte, done func(Result, error)) error {
	select {
	case st.slots <- struct{}{}:
	case <-st.done:
		return st.brokenErr()
	}
	st.mu.Lock()
	if st.waiting == nil {
		st.mu.Unlock()
		<-st.slots
		return st.brokenErr()
	}
	st.next++
	id := st.next
	st.waiting[id] = done
	st.mu.Unlock()
	if err := st.s.Send(&keyfoldv1.IngestStreamRequest{BatchId: id, Pipeline: st.pipeline, Events: events}); err != nil {
		// The receiver reports this batch (with the stream's error).
		<-st.done
		return nil
	}
	return nil
}

func (st *Stream) brokenErr() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil {
		return st.err
	}
	return errors.New("keyfold client: stream closed")
}

// Close waits for the acks of every batch sent, then ends the stream. It
// returns the error that broke the stream, if one did.
func (st *Stream) Close() error {
	err := st.s.CloseSend()
	<-st.done
	st.cancel()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil && !isEOF(st.err) {
		return st.err
	}
	return err
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }
