package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

func newTestPeers() *Peers {
	return NewPeers("self", 1<<20, true, slog.New(slog.DiscardHandler), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// TestForwardRacingRetain: shares queued while their peer is dropped and
// closed, over and over, are all answered (found by a review: a share
// could land in a closed peer's queue and never be answered).
func TestForwardRacingRetain(t *testing.T) {
	const addr = "127.0.0.1:1" // nothing listens
	p := newTestPeers()
	var (
		stop   atomic.Bool
		mu     sync.Mutex
		shares []*Share
		wg     sync.WaitGroup
	)
	for range 32 {
		wg.Go(func() {
			for !stop.Load() {
				if s, err := p.Forward(context.Background(), addr, &keyfoldv1.ForwardBatch{Pipeline: "p", Events: [][]byte{[]byte(`{}`)}}, 2); err == nil {
					mu.Lock()
					shares = append(shares, s)
					mu.Unlock()
				} else if !errors.Is(err, ErrNotSent) {
					t.Errorf("Forward: %v", err)
					return
				}
			}
		})
	}
	// The peer leaves (closed) and comes back (a new peer), over and over.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		p.Retain([]string{addr})
		time.Sleep(200 * time.Microsecond)
		p.Retain(nil)
		time.Sleep(100 * time.Microsecond)
	}
	stop.Store(true)
	wg.Wait()
	p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, s := range shares {
		if _, err := s.Wait(ctx); ctx.Err() != nil {
			t.Fatalf("share %d of %d never answered", i, len(shares))
		} else if err == nil {
			t.Fatalf("share %d answered without an owner", i)
		}
	}
	if len(shares) == 0 {
		t.Fatal("no share was queued")
	}
}

// slowRefuser answers like a member that left gracefully: after a while,
// refusing every batch (it serves no group any more).
type slowRefuser struct {
	keyfoldv1.UnimplementedClusterServer
	received chan struct{} // a call arrived
}

func (r slowRefuser) Forward(_ context.Context, req *keyfoldv1.ForwardRequest) (*keyfoldv1.ForwardResponse, error) {
	r.received <- struct{}{}
	time.Sleep(200 * time.Millisecond) // the answer takes a while: a call in flight
	out := &keyfoldv1.ForwardResponse{}
	for range req.Batches {
		out.Results = append(out.Results, &keyfoldv1.ForwardResult{Refused: true})
	}
	return out, nil
}

// TestRetainLetsAnsweringPeerFinish: a member dropped from the list while
// a call to it is in flight, and still connected (it left gracefully),
// gets to answer: its refusal is routed again by the caller, where a cut
// call would be an unknown outcome (503). A peer no longer listed gets
// ErrNotSent at once.
func TestRetainLetsAnsweringPeerFinish(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	received := make(chan struct{}, 1)
	keyfoldv1.RegisterClusterServer(srv, slowRefuser{received: received})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	addr := ln.Addr().String()
	p := newTestPeers()
	defer p.Close()
	s, err := p.Forward(context.Background(), addr, &keyfoldv1.ForwardBatch{Pipeline: "p", Events: [][]byte{[]byte(`{}`)}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	select { // the call is out
	case <-received:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the peer")
	}
	p.Retain([]string{"127.0.0.1:2"})
	fr, err := s.Wait(context.Background())
	if err != nil || !fr.Refused {
		t.Fatalf("the departed member's answer: %v, %v; want its refusal", fr, err)
	}
	if _, err := p.Forward(context.Background(), addr, &keyfoldv1.ForwardBatch{Pipeline: "p", Events: [][]byte{[]byte(`{}`)}}, 2); !errors.Is(err, ErrNotSent) {
		t.Fatalf("Forward to a departed member: %v, want ErrNotSent", err)
	}
}
