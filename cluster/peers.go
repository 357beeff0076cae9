package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Peers keeps a gRPC connection to each other member and forwards batches
// to them. Forwarding keeps order: each peer has one queue and one Forward
// call in flight, which carries every batch queued while the previous call
// was out (as a group commit does), so batches reach the owner's log in
// the order they were queued, and one batch costs one remote message per
// owner — fewer under load.
type Peers struct {
	self     string
	maxBytes int
	wait     bool // calls wait for a (re)connecting peer
	dial     []grpc.DialOption
	log      *slog.Logger

	mu      sync.Mutex
	peers   map[string]*peer
	members map[string]bool // the last Retain's; nil before the first
	closed  bool
}

// Limits of one Forward call (and NewPeers' maxBytes); a single batch
// above the byte bound still goes, alone.
const (
	maxForwardBatches = 256
	// ForwardTimeout bounds one Forward call.
	ForwardTimeout = 30 * time.Second
	peerQueue      = 1024
)

// NewPeers returns an empty pool; self is this node's member id (sent
// along, for the receivers' logs), maxBytes bounds the event bytes of one
// Forward call (the receivers' message limit, less room for framing), dial
// the options of every connection. With wait, a Forward call waits for a
// peer that is (re)connecting rather than failing at once: right when a
// member list drops dead peers (leases), not when it never does (a static
// list).
func NewPeers(self string, maxBytes int, wait bool, logger *slog.Logger, dial ...grpc.DialOption) *Peers {
	return &Peers{self: self, maxBytes: maxBytes, wait: wait, dial: dial, log: logger, peers: map[string]*peer{}}
}

type peer struct {
	ctx    context.Context // ends when the peer is closed: cuts its call
	cancel context.CancelFunc
	addr   string
	conn   *grpc.ClientConn
	client keyfoldv1.ClusterClient

	mu     sync.Mutex // closed, and sending to queue
	closed bool
	queue  chan *Share
	next   *Share // taken from the queue, too big for the last call (send loop only)
	stop   chan struct{}
	done   chan struct{}
}

// ErrNotSent marks a share that never left this node (its peer is no
// longer a member): nothing of it was logged, so it may be routed again.
var ErrNotSent = errors.New("cluster: batch not sent")

// Share is a batch on its way to its owner.
type Share struct {
	Batch  *keyfoldv1.ForwardBatch
	bytes  int // of its events as forwarded, for the limit of one call
	done   chan struct{}
	result *keyfoldv1.ForwardResult
	err    error // the call failed: the outcome is unknown (or ErrNotSent)
}

// Wait waits for the owner's answer: the result (its Error and Refused
// say whether the batch failed), or err when the call itself failed (the
// batch may or may not have been logged; ErrNotSent: it was not) or ctx
// ended.
func (s *Share) Wait(ctx context.Context) (*keyfoldv1.ForwardResult, error) {
	select {
	case <-s.done:
		return s.result, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Forward queues a batch for member addr and returns at once (waiting only
// while that peer's queue is full); bytes is its size, counted against
// the bound of one call. Batches queued one after the other for one peer
// are logged in that order. An address that is not a member (it left)
// gets ErrNotSent.
func (p *Peers) Forward(ctx context.Context, addr string, batch *keyfoldv1.ForwardBatch, bytes int) (*Share, error) {
	pr, err := p.peer(addr)
	if err != nil {
		return nil, err
	}
	s := &Share{Batch: batch, bytes: bytes, done: make(chan struct{})}
	for {
		pr.mu.Lock()
		if pr.closed {
			pr.mu.Unlock()
			return nil, fmt.Errorf("cluster: peer %s left: %w", addr, ErrNotSent)
		}
		select {
		case pr.queue <- s:
			pr.mu.Unlock()
			return s, nil
		default: // full: wait for room without holding the lock
		}
		pr.mu.Unlock()
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// Client returns the node-to-node client of member addr.
func (p *Peers) Client(addr string) (keyfoldv1.ClusterClient, error) {
	pr, err := p.peer(addr)
	if err != nil {
		return nil, err
	}
	return pr.client, nil
}

func (p *Peers) peer(addr string) (*peer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("cluster: peers closed: %w", ErrNotSent)
	}
	if pr := p.peers[addr]; pr != nil {
		return pr, nil
	}
	if p.members != nil && !p.members[addr] {
		return nil, fmt.Errorf("cluster: %s is not a member: %w", addr, ErrNotSent)
	}
	conn, err := grpc.NewClient(addr, p.dial...)
	if err != nil {
		return nil, fmt.Errorf("cluster: peer %s: %w", addr, err)
	}
	pr := &peer{addr: addr, conn: conn, client: keyfoldv1.NewClusterClient(conn),
		queue: make(chan *Share, peerQueue), stop: make(chan struct{}), done: make(chan struct{})}
	pr.ctx, pr.cancel = context.WithCancel(context.Background())
	p.peers[addr] = pr
	go p.send(pr)
	return pr, nil
}

// send is a peer's forwarding loop.
func (p *Peers) send(pr *peer) {
	defer close(pr.done)
	for {
		select {
		case <-pr.stop: // closed: nothing more leaves
			return
		default:
		}
		first := pr.next
		pr.next = nil
		if first == nil {
			select {
			case first = <-pr.queue:
			case <-pr.stop:
				return
			}
		}
		batch, bytes := []*Share{first}, first.bytes
	more:
		for len(batch) < maxForwardBatches {
			select {
			case s := <-pr.queue:
				if bytes+s.bytes > p.maxBytes {
					pr.next = s // the next call's first
					break more
				}
				batch = append(batch, s)
				bytes += s.bytes
			default:
				break more
			}
		}
		req := &keyfoldv1.ForwardRequest{From: p.self, Batches: make([]*keyfoldv1.ForwardBatch, len(batch))}
		for i, s := range batch {
			req.Batches[i] = s.Batch
		}
		ctx, cancel := context.WithTimeout(pr.ctx, ForwardTimeout)
		resp, err := pr.client.Forward(ctx, req, grpc.WaitForReady(p.wait))
		cancel()
		if err == nil && len(resp.Results) != len(batch) {
			err = fmt.Errorf("answered %d batches of %d", len(resp.Results), len(batch))
		}
		for i, s := range batch {
			if err != nil {
				s.err = fmt.Errorf("cluster: forward to %s: %w", pr.addr, err)
			} else {
				s.result = resp.Results[i]
			}
			close(s.done)
		}
	}
}

// failUnsent answers the shares that never left: the one set aside and
// those still queued. Only once the send loop is done.
func failUnsent(pr *peer) {
	unsent := func(s *Share) {
		s.err = fmt.Errorf("cluster: peer %s left before the batch was sent: %w", pr.addr, ErrNotSent)
		close(s.done)
	}
	if s := pr.next; s != nil {
		pr.next = nil
		unsent(s)
	}
	for {
		select {
		case s := <-pr.queue:
			unsent(s)
		default:
			return
		}
	}
}

// Retain makes members the member list: connections to peers not in it
// are closed, and forwarding to them fails with ErrNotSent. A call in
// flight to a departed peer that is still connected (it left gracefully
// and answers) finishes; one to a peer that is not is cut (it was killed:
// waiting helps no one).
func (p *Peers) Retain(members []string) {
	p.mu.Lock()
	p.members = make(map[string]bool, len(members))
	for _, m := range members {
		p.members[m] = true
	}
	var gone []*peer
	for addr, pr := range p.peers {
		if !p.members[addr] {
			delete(p.peers, addr)
			gone = append(gone, pr)
		}
	}
	p.mu.Unlock()
	for _, pr := range gone {
		go func() { p.closePeer(pr, !connected(pr.conn)) }()
	}
}

// connected reports whether conn is connected to its peer. gRPC hands a
// new connection to calls before it reports the channel ready
// (ccBalancerWrapper.updateState: the picker, then the state), so a call
// can be on the wire while the channel still says Connecting: that state
// is waited out, for a second at most, before the answer. (Read at once,
// it cut a call in flight to a peer that was leaving gracefully, now and
// then: TestRetainLetsAnsweringPeerFinish on a loaded machine.)
func connected(conn *grpc.ClientConn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for {
		s := conn.GetState()
		if s != connectivity.Connecting || !conn.WaitForStateChange(ctx, s) {
			return s == connectivity.Ready
		}
	}
}

// closePeer stops a peer: no share enters its queue any more, the call in
// flight finishes (or, with cut, is cut: its outcome is unknown), the
// shares that never left get ErrNotSent, and the connection closes.
func (p *Peers) closePeer(pr *peer, cut bool) {
	pr.mu.Lock()
	pr.closed = true
	pr.mu.Unlock()
	close(pr.stop)
	if cut {
		pr.cancel()
	}
	<-pr.done
	failUnsent(pr)
	pr.cancel()
	if err := pr.conn.Close(); err != nil {
		p.log.Debug("close peer connection", "peer", pr.addr, "err", err)
	}
}

// Close closes every connection, cutting the calls in flight.
func (p *Peers) Close() {
	p.mu.Lock()
	p.closed = true
	peers := p.peers
	p.peers = map[string]*peer{}
	p.mu.Unlock()
	for _, pr := range peers {
		p.closePeer(pr, true)
	}
}
