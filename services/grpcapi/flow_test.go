package grpcapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold/actors"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi"
	"github.com/keyfold/keyfold/services/grpcapi/client"
)

// stalledBackend accepts batches and completes none until released: a node
// whose store stopped answering.
type stalledBackend struct {
	grpcapi.Backend // the methods not defined below are never called
	submitted       atomic.Int64
	release         chan struct{}
}

func (b *stalledBackend) Ingest(ctx context.Context, p string, ev [][]byte) (actors.Result, error) {
	pe, _ := b.Submit(ctx, p, ev)
	return pe.Wait(ctx)
}

func (b *stalledBackend) Submit(_ context.Context, _ string, ev [][]byte) (actors.Pending, error) {
	b.submitted.Add(1)
	return stalledPending{b, len(ev)}, nil
}

func (b *stalledBackend) Query(context.Context, string, string) (*keyfoldv1.GetStateResponse, error) {
	return &keyfoldv1.GetStateResponse{}, nil
}
func (b *stalledBackend) Delete(context.Context, string, string) error { return nil }
func (b *stalledBackend) Pipelines() []*keyfoldv1.PipelineInfo         { return nil }
func (b *stalledBackend) Joins() []*keyfoldv1.JoinInfo                 { return nil }

type stalledPending struct {
	b *stalledBackend
	n int
}

func (p stalledPending) Wait(ctx context.Context) (actors.Result, error) {
	select {
	case <-p.b.release:
		return actors.Result{Accepted: p.n}, nil
	case <-ctx.Done():
		return actors.Result{}, ctx.Err()
	}
}

func serve(t *testing.T, b grpcapi.Backend, opts grpcapi.Options) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	grpcapi.Register(s, b, opts)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestStreamFlowControl: a client that sends batch after batch without
// reading acks, to a node that completes none, gets no more than the
// window read by the server: the rest waits in the client (HTTP/2 flow
// control), not in the server's memory. Once the node catches up every
// batch is acknowledged, in order.
func TestStreamFlowControl(t *testing.T) {
	b := &stalledBackend{release: make(chan struct{})}
	const window = 4
	conn := serve(t, b, grpcapi.Options{StreamWindow: window, MaxConcurrentIngests: 100})
	stream, err := keyfoldv1.NewKeyfoldClient(conn).IngestStream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const batches = 300
	event := []byte(fmt.Sprintf(`{"k":"%01000d"}`, 0)) // ≈ 1 KB
	var sent atomic.Int64
	sendDone := make(chan error, 1)
	go func() {
		for i := range batches {
			evs := make([][]byte, 20) // ≈ 20 KB a batch, 6 MB in all
			for j := range evs {
				evs[j] = event
			}
			if err := stream.Send(&keyfoldv1.IngestStreamRequest{BatchId: uint64(i), Pipeline: "p", Events: evs}); err != nil {
				sendDone <- err
				return
			}
			sent.Add(1)
		}
		sendDone <- stream.CloseSend()
	}()
	// Wait until the client is held back: what it has sent stops growing.
	deadline := time.Now().Add(10 * time.Second)
	for last, stable := int64(-1), 0; stable < 20; {
		if time.Now().After(deadline) {
			t.Fatalf("the client never stopped sending (%d of %d sent)", sent.Load(), batches)
		}
		if s := sent.Load(); s == last {
			stable++
		} else {
			last, stable = s, 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The window's batches, the one its acker waits on, and one read that
	// waits for room.
	if got := b.submitted.Load(); got > window+2 {
		t.Errorf("the server read %d batches while none was acknowledged; want at most the window (%d) + 2", got, window)
	}
	if s := sent.Load(); s == batches {
		t.Errorf("the client sent all %d batches into a stalled stream: nothing held it back", batches)
	}
	t.Logf("stalled: server read %d batches, client sent %d of %d", b.submitted.Load(), sent.Load(), batches)

	close(b.release)
	for i := range batches {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ack %d: %v", i, err)
		}
		if resp.BatchId != uint64(i) || resp.Error != nil || resp.Accepted != 20 {
			t.Fatalf("ack %d = %v", i, resp)
		}
	}
	if err := <-sendDone; err != nil {
		t.Fatal(err)
	}
}

// TestIngestSlots: unary calls beyond MaxConcurrentIngests wait for a slot
// and, if their deadline passes first, fail with ResourceExhausted.
func TestIngestSlots(t *testing.T) {
	b := &stalledBackend{release: make(chan struct{})}
	conn := serve(t, b, grpcapi.Options{MaxConcurrentIngests: 2})
	c := keyfoldv1.NewKeyfoldClient(conn)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := c.Ingest(context.Background(), &keyfoldv1.IngestRequest{Pipeline: "p", Events: [][]byte{[]byte(`{}`)}}); err != nil {
				t.Error(err)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.submitted.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two first calls never reached the backend")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Ingest(ctx, &keyfoldv1.IngestRequest{Pipeline: "p", Events: [][]byte{[]byte(`{}`)}})
	if code := status.Code(err); code != codes.ResourceExhausted && code != codes.DeadlineExceeded {
		t.Errorf("a third call without a slot: %v, want ResourceExhausted (or the client's DeadlineExceeded)", err)
	}
	close(b.release)
	wg.Wait()
}

// downBackend fails every batch as a node whose store is down does.
type downBackend struct{ stalledBackend }

func (*downBackend) Submit(context.Context, string, [][]byte) (actors.Pending, error) {
	return nil, fmt.Errorf("%w: the store is unreachable", actors.ErrUnavailable)
}

func (b *downBackend) Ingest(ctx context.Context, p string, ev [][]byte) (actors.Result, error) {
	_, err := b.Submit(ctx, p, ev)
	return actors.Result{}, err
}

// TestSendGivesUp: against a node that keeps failing, Send returns when
// its retries are spent, or when its context ends, whichever is first; it
// never spins.
func TestSendGivesUp(t *testing.T) {
	conn := serve(t, &downBackend{}, grpcapi.Options{})
	events := func(yield func([]byte, error) bool) {
		for i := range 50 {
			if !yield(fmt.Appendf(nil, `{"k":"%d"}`, i), nil) {
				return
			}
		}
	}
	for _, tc := range []struct {
		name    string
		retries int
		timeout time.Duration
	}{{"no retries", -1, time.Minute}, {"retries spent", 2, time.Minute}, {"deadline", 50, 500 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			c := client.New(conn, client.Options{MaxRetries: tc.retries})
			ctx, cancel := context.WithTimeout(t.Context(), tc.timeout)
			defer cancel()
			start := time.Now()
			_, err := c.Send(ctx, "p", events, client.SendOptions{Batch: 10})
			if status.Code(err) != codes.Unavailable && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Send = %v, want Unavailable or the deadline", err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("Send took %v to give up", took)
			}
		})
	}
}
