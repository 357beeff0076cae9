package keyfold

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/cluster"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services"
	"github.com/keyfold/keyfold/services/grpcapi"
	"github.com/keyfold/keyfold/services/metrics"
	"github.com/redis/go-redis/v9"
)

// A node in a cluster (Config.Cluster) serves the key groups placement
// gives it and passes the rest of the work to their owners:
//
//   - membership: the node holds a lease in Redis (cluster.Registry) and
//     renews it every lease/3, or reads a static list (Config.Peers); each
//     change of the member list recomputes the placement (cluster.Assign).
//   - hand-off: groups the node loses are released at once (their inputs
//     refused, their results stored, a checkpoint written) and their new
//     owners told (Released); groups it gains from a member that is still
//     alive are taken over on that member's word, or at the latest one
//     renew period later, by when it has seen the change, so the new owner
//     replays next to nothing. A departed member's groups are taken over at
//     once. A joining or leaving node asks the others to read the list now
//     (MembersChanged). A node that cannot renew its lease for about a
//     lease releases everything. The store's epochs fence a stale owner
//     whatever the timing.
//   - a lapsed lease: a renewal that finds the node's lease had run out
//     (the process was paused, or cut off, for longer than the lease)
//     means the others may have dropped it and taken its groups over. The
//     node abandons every group (drops its keys from memory, writes
//     nothing) and takes its share back as a joining node does.
//   - reads: a key's state is answered from memory only while the node's
//     lease is confirmed by the store recently enough that no other member
//     can have taken the key's group over (see checkRead); otherwise the
//     query is refused as not served, and routed again.
//   - routing: an ingest is validated whole, split by owner, its own share
//     logged here and each other share queued for its owner (cluster.Peers:
//     one Forward call in flight per owner, in order). A share refused
//     because its owner does not serve the group yet (nothing of it was
//     logged) is routed again with the next member list. Queries and
//     deletions go to the key's owner.

// clusterNode is a node's membership in a cluster.
type clusterNode struct {
	n      *Node
	name   string
	self   string
	groups uint32
	lease  time.Duration
	reg    *cluster.Registry // nil with a static member list
	static cluster.Static
	peers  *cluster.Peers
	log    *slog.Logger

	view     atomic.Pointer[view]
	applied  atomic.Pointer[cluster.Assignment] // the last placement fully applied
	refresh  chan struct{}                      // asks the renew loop to renew now
	regMu    sync.Mutex                         // a renewal, or setting left and deregistering
	left     atomic.Bool                        // deregistered: the renew loop only reads
	notices  sync.WaitGroup                     // notices to members in flight
	leaving  sync.Map                           // member id → when it said it was leaving
	joined   chan struct{}                      // closed once the node serves its first placement
	joinOnce sync.Once

	stopApply context.CancelFunc
	applyDone chan struct{}
	stopRenew context.CancelFunc
	renewDone chan struct{}

	forwarded, received, rerouted, moved atomic.Int64

	// Reads are served from memory only under a lease the store confirmed
	// recently (see checkRead): confirmed is when the last such renewal
	// was sent, as nanoseconds since base on the monotonic clock, plus one
	// (0: none yet).
	base      time.Time
	confirmed atomic.Int64

	maxForward int // bytes of events in one forwarded batch

	// Releases other members announced for groups placement gives this
	// node (see Released), and a signal that one arrived.
	releasedMu sync.Mutex
	released   map[uint32]releaseNote
	releasedCh chan struct{}
}

// releaseNote is a previous owner's word that it released a group.
type releaseNote struct {
	from string
	at   time.Time
}

// view is a member list and its placement, as this node saw it.
type view struct {
	a    cluster.Assignment
	prev cluster.Assignment // the placement before it
	at   time.Time
	next chan struct{} // closed when a newer view replaces this one
}

// A refused call is routed again when the member list changes, or after a
// backoff: the new owner may still be taking the group over (its take-over
// ends without notice here), so the backoff stays short.
const (
	rerouteBackoff    = 10 * time.Millisecond
	maxRerouteBackoff = 100 * time.Millisecond
)

// rerouteFor bounds how long a refused share or a query is routed again
// before the caller gets ErrUnavailable.
const rerouteFor = 10 * time.Second

func newClusterNode(n *Node, store persistence.Store) (*clusterNode, error) {
	cfg := n.cfg
	c := &clusterNode{
		n: n, name: cfg.Cluster, self: cfg.Advertise, groups: cfg.KeyGroups, lease: cfg.ClusterLease,
		log: cfg.Logger.With("cluster", cfg.Cluster), refresh: make(chan struct{}, 1), joined: make(chan struct{}),
		released: map[uint32]releaseNote{}, releasedCh: make(chan struct{}, 1), base: time.Now(),
		// Half the receivers' message limit (max_body_bytes): room for
		// the framing of many small events.
		maxForward: int(cfg.MaxBodyBytes / 2),
	}
	if c.self == "" {
		c.self = n.GRPCAddr() // Validate made sure its host is specific
	}
	if len(cfg.Peers) > 0 {
		c.static = cluster.Static(cfg.Peers)
		if !slices.Contains(cfg.Peers, c.self) {
			return nil, fmt.Errorf("keyfold: cluster: peers %v do not include this node's address %s", cfg.Peers, c.self)
		}
	} else {
		rs, ok := store.(interface {
			Client() redis.UniversalClient
			Prefix() string
		})
		if !ok {
			return nil, errors.New("keyfold: cluster: membership needs a Redis store, or a static list of peers")
		}
		c.reg = cluster.NewRegistry(rs.Client(), rs.Prefix()+":cluster:"+cfg.Cluster, cfg.ClusterLease)
		c.lease = c.reg.Lease()
	}
	if c.lease <= 0 {
		c.lease = cluster.DefaultLease
	}
	creds, err := peerCredentials(cfg)
	if err != nil {
		return nil, err
	}
	c.peers = cluster.NewPeers(c.self, c.maxForward, c.reg != nil, c.log, grpc.WithTransportCredentials(creds),
		// Members are near each other: reconnect within a second, not
		// gRPC's default of up to two minutes after a long outage.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(cfg.MaxBodyBytes))))
	return c, nil
}

// peerCredentials: plaintext, or TLS when the node serves TLS (verifying
// peers against the system roots and the node's own certificate, so that
// nodes sharing a self-signed certificate trust each other).
func peerCredentials(cfg Config) (credentials.TransportCredentials, error) {
	if cfg.GRPCTLSCert == "" {
		return insecure.NewCredentials(), nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(cfg.GRPCTLSCert)
	if err != nil {
		return nil, fmt.Errorf("keyfold: cluster: %w", err)
	}
	pool.AppendCertsFromPEM(pem)
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), nil
}

// renewInterval is how often the lease is renewed and the list read.
func (c *clusterNode) renewInterval() time.Duration { return c.lease / 3 }

// join starts the membership and placement loops and waits until the node
// serves its first placement (or ctx ends).
func (c *clusterNode) join(ctx context.Context, h *actors.Host) error {
	rctx, stopRenew := context.WithCancel(context.Background())
	actx, stopApply := context.WithCancel(context.Background())
	c.stopRenew, c.renewDone = stopRenew, make(chan struct{})
	c.stopApply, c.applyDone = stopApply, make(chan struct{})
	go c.renewLoop(rctx)
	go c.applyLoop(actx, h)
	c.log.Info("joining", "member", c.self, "lease", c.lease, "membership", c.membership())
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-c.joined:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := h.Err(); err != nil {
				return err
			}
		}
	}
}

func (c *clusterNode) membership() string {
	if c.reg != nil {
		return "redis"
	}
	return "static"
}

// renewLoop renews the lease (or reads the static list) every renew
// interval, or sooner when asked, and publishes each new member list.
//
// A node that cannot renew its lease for about a lease's time must assume
// the others dropped it and took its groups over: it fences itself (serves
// a member list without itself, releasing every group) instead of
// fighting them for the groups until it can renew again. After failed or
// hung renewals it waits a renew interval before acting on the list, so
// that members whose leases ran out meanwhile (Redis restarted or stalled)
// can register again first.
//
// A node that did not run at all for longer than its lease (SIGSTOP, a GC
// pause, a stalled VM) had no chance to fence itself: its first renewal
// afterwards finds that its lease ran out (or, measured here, that more
// than a lease passed since the last renewal that found it live). The
// others may have served its groups and written to them meanwhile, so it
// abandons them all at once, without writing, and takes its share back
// through the hand-off a joining node goes through (see rejoin).
//
// Each renewal whose member list the node acts on confirms its lease for
// reads, as of when the renewal was sent (see checkRead).
func (c *clusterNode) renewLoop(ctx context.Context) {
	defer close(c.renewDone)
	t := time.NewTicker(c.renewInterval())
	defer t.Stop()
	var (
		failing     bool
		lastOK      = time.Now() // when the last renewal that succeeded was sent
		settleUntil time.Time
		rejoin      bool // the lease lapsed: act on the next member list as a joining node
	)
	for {
		began := time.Now()
		cctx, cancel := context.WithTimeout(ctx, c.renewInterval())
		members, held, err := c.members(cctx)
		cancel()
		switch {
		case err == nil:
			// (A static list has no lease: no one takes a paused member's
			// groups. Before the first view there is nothing to lose.)
			if gap := began.Sub(lastOK); c.reg != nil && c.view.Load() != nil && !c.left.Load() && (!held || gap > c.lease) {
				c.lapse(held, gap)
				rejoin = true
			}
			lastOK = began // live from here on, if it was not before
			// A renewal that hung (a stalled Redis: its clock ran on, so
			// the others' leases may have run out while they could not
			// renew either) is treated as a failure that just ended.
			if slow := time.Since(began) > c.renewInterval(); failing || slow {
				failing = false
				settleUntil = time.Now().Add(c.renewInterval())
				c.log.Info("membership reachable again; acting on the member list after a renew interval",
					"renewal_took", time.Since(began).Round(time.Millisecond))
			}
			if time.Now().After(settleUntil) {
				if rejoin {
					c.rejoin(members)
					rejoin = false
				} else {
					c.observe(members)
				}
				c.confirm(began)
			}
		case ctx.Err() != nil:
			return
		default:
			if !failing {
				c.log.Warn("cannot renew the membership lease; serving the last member list", "err", err)
				failing = true
			}
			if cur := c.view.Load(); c.reg != nil && cur != nil && slices.Contains(cur.a.Members, c.self) &&
				time.Since(lastOK) > c.lease-c.renewInterval()/2 {
				c.log.Warn("membership lease lost: releasing every key group until it can be renewed", "err", err)
				c.observe(slices.DeleteFunc(slices.Clone(cur.a.Members), func(m string) bool { return m == c.self }))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.refresh:
			if !sleepCtx(ctx, 50*time.Millisecond) { // at most ~20 renewals a second
				return
			}
		}
	}
}

// members renews the lease and returns the live members, and whether the
// lease was live until this renewal (true where there is no lease to
// lapse: a static list, or after the node left).
func (c *clusterNode) members(ctx context.Context) ([]string, bool, error) {
	if c.reg == nil {
		ms, err := c.static.Members(ctx)
		return ms, true, err
	}
	// Not between a leave's check and its deregistration: a renewal then
	// would register the node again.
	c.regMu.Lock()
	defer c.regMu.Unlock()
	if c.left.Load() {
		ms, err := c.reg.Members(ctx)
		return ms, true, err
	}
	return c.reg.Extend(ctx, c.self)
}

// errLeaseLapsed is why a node whose lease ran out abandoned its groups.
var errLeaseLapsed = errors.New("keyfold: cluster: the membership lease lapsed")

// lapse reacts to a lease found to have run out (held false: the store
// says so) or to have been unrenewed for more than a lease (gap): reads
// are refused and every group is abandoned, unsaved, before the node acts
// on a member list again.
func (c *clusterNode) lapse(held bool, gap time.Duration) {
	c.confirmed.Store(0)
	c.log.Warn("membership lease lapsed: abandoning every key group, then taking this node's share back as a joining member",
		"since_last_renewal", gap.Round(time.Millisecond), "lease", c.lease, "ran_out_in_store", !held)
	if h := c.n.host.Load(); h != nil {
		h.Abandon(errLeaseLapsed)
	}
}

// rejoin publishes members as the view of a node that just joined: it holds
// nothing (its groups were abandoned) and the others are taken to hold its
// share, so each group is taken over once its holder says it released it
// or a renew period later, as for a new member, and the others are asked
// to read the list now.
func (c *clusterNode) rejoin(members []string) {
	others := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == c.self })
	prev := cluster.Assign(others, c.groups)
	c.applied.Store(&prev) // before the view: its apply starts from here
	v := &view{a: cluster.Assign(members, c.groups), prev: prev, at: time.Now(), next: make(chan struct{})}
	cur := c.view.Load()
	c.view.Store(v)
	if cur != nil {
		close(cur.next)
	}
	c.peers.Retain(members)
	c.log.Info("members after the lease lapsed", "members", members, "groups_here", len(v.a.Groups(c.self)))
	c.tellMembersChanged(members, false)
}

// confirm records that the lease was live at the store when a renewal sent
// at began reached it, and that its member list is the node's view.
func (c *clusterNode) confirm(began time.Time) {
	c.confirmed.Store(int64(began.Sub(c.base)) + 1)
}

// readLease is how long after a renewal was sent the node still answers
// reads from memory. A member that takes over a group from a live one
// waits a renew interval and handoffMargin after it saw the list that
// moves the group (apply); the list changed after this node's renewal
// reached the store, which was after the renewal was sent. So within
// readLease of that send no other member has taken over a group this
// node's view still gives it, and half the margin is left for the clocks'
// rates and the time between the check and the answer. A member that
// dropped this node (its lease ran out: at least a lease after the send)
// takes over at once, later still.
func (c *clusterNode) readLease() time.Duration { return c.renewInterval() + handoffMargin/2 }

// errLeaseUnconfirmed refuses a read from memory: the node's lease was not
// confirmed by the store recently enough (see readLease).
var errLeaseUnconfirmed = errors.New("keyfold: cluster: membership lease not confirmed recently")

// checkRead returns nil if this node may answer a query for a key of
// group g from its memory now: its lease was confirmed within readLease
// and its view gives it the group. Otherwise it returns a refusal (not
// served, unavailable), which routes the query again. With a static member
// list nothing moves and there is nothing to check.
func (c *clusterNode) checkRead(g uint32) error {
	if c.reg == nil {
		return nil
	}
	conf := c.confirmed.Load()
	if conf == 0 {
		return notServed(errLeaseUnconfirmed)
	}
	if since := time.Since(c.base) - time.Duration(conf-1); since >= c.readLease() {
		c.askRefresh() // the caller routes the query again: have a renewal ready for it
		return notServed(fmt.Errorf("%w: last renewal sent %v ago", errLeaseUnconfirmed, since.Round(time.Millisecond)))
	}
	if v := c.view.Load(); v == nil || v.a.Owner(g) != c.self {
		return notServed(fmt.Errorf("%w: key group %d", actors.ErrNotOwner, g))
	}
	return nil
}

// askRefresh asks the renew loop to read the member list now.
func (c *clusterNode) askRefresh() {
	select {
	case c.refresh <- struct{}{}:
	default:
	}
}

// observe publishes a member list if it changed.
func (c *clusterNode) observe(members []string) {
	cur := c.view.Load()
	if cur != nil && slices.Equal(cur.a.Members, members) {
		return
	}
	v := &view{a: cluster.Assign(members, c.groups), at: time.Now(), next: make(chan struct{})}
	if cur != nil {
		v.prev = cur.a
		joined, left := diff(cur.a.Members, members)
		moved := len(cluster.Moved(cur.a, v.a))
		c.moved.Add(int64(moved))
		attrs := []any{"members", len(members), "joined", joined, "left", left,
			"groups_moved", moved, "groups_here", len(v.a.Groups(c.self))}
		if failed := c.unannounced(left); len(failed) > 0 {
			// Dropped without saying goodbye: killed, hung or cut off, and
			// detected by its lease running out.
			attrs = append(attrs, "failed", failed)
		}
		c.log.Info("members changed", attrs...)
	} else {
		// Before this node joined, the others held its groups. Tell them it
		// is here, so that they release its share now rather than at their
		// next renewal.
		v.prev = cluster.Assign(slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == c.self }), c.groups)
		c.log.Info("members", "members", members, "groups_here", len(v.a.Groups(c.self)))
	}
	c.view.Store(v)
	if cur != nil {
		close(cur.next)
	}
	// After the view: a call routed with the old one to a departed member
	// gets ErrNotSent and is routed again with this one.
	c.peers.Retain(members)
	if cur == nil {
		c.tellMembersChanged(members, false)
	}
}

// diff returns the members of b not in a, and those of a not in b.
func diff(a, b []string) (added, removed []string) {
	for _, m := range b {
		if !slices.Contains(a, m) {
			added = append(added, m)
		}
	}
	for _, m := range a {
		if !slices.Contains(b, m) {
			removed = append(removed, m)
		}
	}
	return added, removed
}

// applyLoop makes the host serve each view's groups: it releases lost
// groups at once, takes over groups of departed members at once, and the
// groups of members still alive one renew period (plus a margin) after
// the view appeared.
func (c *clusterNode) applyLoop(ctx context.Context, h *actors.Host) {
	defer close(c.applyDone)
	var v *view
	for {
		for v = c.view.Load(); v == nil; v = c.view.Load() {
			if !sleepCtx(ctx, 10*time.Millisecond) {
				return
			}
		}
		// A newer view interrupts this one's take-overs (the take-over
		// loop finishes those still owned).
		vctx, cancel := context.WithCancel(ctx)
		next := v.next
		go func() {
			select {
			case <-next:
				cancel()
			case <-vctx.Done():
			}
		}()
		c.apply(vctx, h, v)
		select {
		case <-ctx.Done():
			cancel()
			return
		case <-v.next:
		}
		cancel()
	}
}

// handoffMargin is added to the renew interval before taking over a group
// from a live member: its release (a checkpoint) has had time to run.
const handoffMargin = 250 * time.Millisecond

func (c *clusterNode) apply(ctx context.Context, h *actors.Host, v *view) {
	// Who holds a group now is the owner in the last placement applied
	// here, not in the previous view: that one may have been replaced
	// before this node acted on it.
	prev := v.prev
	applied := c.applied.Load()
	if applied != nil {
		prev = *applied
	}
	mine := v.a.Groups(c.self)
	owned := h.Owned()
	keep := intersect(owned, mine)
	if len(keep) < len(owned) {
		if c.setOwned(ctx, h, keep) {
			c.tellReleased(v, owned, mine)
		}
	}
	var now, later []uint32
	for _, g := range mine {
		if slices.Contains(keep, g) {
			continue
		}
		if o := prev.Owner(g); o != "" && o != c.self && slices.Contains(v.a.Members, o) {
			later = append(later, g)
		} else {
			now = append(now, g)
		}
	}
	c.forgetReleased(now) // taken without a note: an old one must not serve later
	if len(now) > 0 {
		keep = append(keep, now...)
		slices.Sort(keep)
		if !c.setOwned(ctx, h, keep) {
			return
		}
	}
	// The groups of live members: each as soon as its previous owner says
	// it released it, the rest one renew period (and a margin) after the
	// change, by when their owners have seen it.
	deadline := time.NewTimer(time.Until(v.at.Add(c.renewInterval() + handoffMargin)))
	defer deadline.Stop()
	for len(later) > 0 {
		if ready := c.takeReleased(prev, later); len(ready) > 0 {
			later = slices.DeleteFunc(later, func(g uint32) bool { return slices.Contains(ready, g) })
			keep = append(keep, ready...)
			slices.Sort(keep)
			if !c.setOwned(ctx, h, keep) {
				return
			}
			continue
		}
		select {
		case <-c.releasedCh:
			continue
		case <-deadline.C:
		case <-ctx.Done():
			return
		}
		c.forgetReleased(later)
		if !c.setOwned(ctx, h, mine) {
			return
		}
		break
	}
	if ctx.Err() == nil {
		// Unless a lapsed lease reset it meanwhile (rejoin).
		c.applied.CompareAndSwap(applied, &v.a)
		c.joinOnce.Do(func() { close(c.joined) })
	}
}

// setOwned applies groups to the host; false if ctx ended first.
func (c *clusterNode) setOwned(ctx context.Context, h *actors.Host, groups []uint32) bool {
	if err := h.SetOwned(ctx, groups); err != nil {
		if ctx.Err() == nil {
			c.log.Warn("placement not fully applied; the take-over loop retries", "err", err)
		}
		return false
	}
	return true
}

func intersect(a, b []uint32) []uint32 {
	var out []uint32
	for _, g := range a {
		if slices.Contains(b, g) {
			out = append(out, g)
		}
	}
	return out
}

// leave hands the node's groups over and deregisters: it stops applying
// placements, releases every group (stores results, checkpoints), then
// drops its lease, so the next owners take over at once and replay next to
// nothing. The renew loop goes on reading the list, so that calls still
// in flight here are routed to the new owners.
func (c *clusterNode) leave(ctx context.Context, h *actors.Host) {
	start := time.Now()
	c.stopApply()
	<-c.applyDone
	// A failed host writes nothing more (its memory may not match its
	// log): its groups' next owners replay them.
	if h.Err() == nil {
		if err := h.SetOwned(ctx, nil); err != nil {
			c.log.Warn("release before leaving", "err", err)
		}
	}
	c.regMu.Lock()
	c.left.Store(true)
	if c.reg != nil {
		if err := c.reg.Leave(ctx, c.self); err != nil {
			c.log.Warn("deregister (the lease runs out instead)", "err", err)
		}
	}
	c.regMu.Unlock()
	if v := c.view.Load(); c.reg != nil && v != nil {
		c.tellMembersChanged(v.a.Members, true)
	}
	c.notices.Wait() // before the connections close
	c.askRefresh()
	c.log.Info("left the cluster", "took", time.Since(start).Round(time.Millisecond))
}

// notifyTimeout bounds the best-effort notices between members.
const notifyTimeout = time.Second

// tellMembersChanged asks the other members to read the member list now.
// Best effort: they read it at their next renewal anyway.
func (c *clusterNode) tellMembersChanged(members []string, leaving bool) {
	for _, m := range members {
		if m == c.self {
			continue
		}
		c.notices.Go(func() {
			c.notify(m, func(ctx context.Context, cl keyfoldv1.ClusterClient) error {
				_, err := cl.MembersChanged(ctx, &keyfoldv1.MembersChangedRequest{From: c.self, Leaving: leaving})
				return err
			})
		})
	}
}

// tellReleased tells the new owners of the groups this node owned and no
// longer does that it released them. Best effort: without the notice they
// wait a renew period.
func (c *clusterNode) tellReleased(v *view, owned, mine []uint32) {
	byOwner := map[string][]uint32{}
	for _, g := range owned {
		if !slices.Contains(mine, g) {
			if o := v.a.Owner(g); o != "" && o != c.self {
				byOwner[o] = append(byOwner[o], g)
			}
		}
	}
	for o, gs := range byOwner {
		c.notices.Go(func() {
			c.notify(o, func(ctx context.Context, cl keyfoldv1.ClusterClient) error {
				_, err := cl.Released(ctx, &keyfoldv1.ReleasedRequest{From: c.self, Groups: gs})
				return err
			})
		})
	}
}

func (c *clusterNode) notify(member string, call func(context.Context, keyfoldv1.ClusterClient) error) {
	cl, err := c.peers.Client(member)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		err = call(ctx, cl)
		cancel()
	}
	if err != nil {
		c.log.Debug("notice to a member failed", "member", member, "err", err)
	}
}

// noteReleased records that member from released groups.
func (c *clusterNode) noteReleased(from string, groups []uint32) {
	now := time.Now()
	c.releasedMu.Lock()
	for _, g := range groups {
		if g < c.groups {
			c.released[g] = releaseNote{from: from, at: now}
		}
	}
	c.releasedMu.Unlock()
	select {
	case c.releasedCh <- struct{}{}:
	default:
	}
}

// takeReleased returns (and forgets) the groups of want whose owner in
// prev has said it released them. A note older than the lease is
// dropped: it belongs to an earlier hand-off.
func (c *clusterNode) takeReleased(prev cluster.Assignment, want []uint32) []uint32 {
	c.releasedMu.Lock()
	defer c.releasedMu.Unlock()
	var ready []uint32
	for g, note := range c.released {
		switch {
		case time.Since(note.at) > c.lease:
			delete(c.released, g)
		case slices.Contains(want, g) && note.from == prev.Owner(g):
			delete(c.released, g)
			ready = append(ready, g)
		}
	}
	return ready
}

// unannounced returns the departed members that did not say they were
// leaving (within two leases).
func (c *clusterNode) unannounced(left []string) []string {
	var failed []string
	for _, m := range left {
		at, ok := c.leaving.LoadAndDelete(m)
		if !ok || time.Since(at.(time.Time)) > 2*c.lease {
			failed = append(failed, m)
		}
	}
	return failed
}

// forgetReleased drops the notes of groups taken over without one.
func (c *clusterNode) forgetReleased(groups []uint32) {
	c.releasedMu.Lock()
	for _, g := range groups {
		delete(c.released, g)
	}
	c.releasedMu.Unlock()
}

// stop ends the membership loop and closes the peer connections.
func (c *clusterNode) stop() {
	if c.stopApply != nil {
		c.stopApply()
		<-c.applyDone
	}
	if c.stopRenew != nil {
		c.stopRenew()
		<-c.renewDone
	}
	c.notices.Wait()
	c.peers.Close()
}

// ownerOf returns the current owner of a key's group and the view.
func (c *clusterNode) ownerOf(pipeline, key string) (string, *view) {
	v := c.view.Load()
	return v.a.Owner(actors.GroupOf(pipeline, key, c.groups)), v
}

// part is the share of a routed batch that one owner logs.
type part struct {
	owner  string
	events []*fold.Event
	bytes  int // of the events
	local  *actors.Pending
	remote *cluster.Share
	err    error // refused or failed before it was sent
}

// routedIngest is a batch split among owners.
type routedIngest struct {
	c        *clusterNode
	h        *actors.Host
	pipeline string
	parts    []*part
	start    time.Time
}

// submit splits a validated batch by owner and queues each share: its own
// with the host, the others with their owners.
func (c *clusterNode) submit(ctx context.Context, h *actors.Host, pipeline string, events []*fold.Event) (*routedIngest, error) {
	r := &routedIngest{c: c, h: h, pipeline: pipeline, start: time.Now()}
	parts, err := c.route(ctx, h, pipeline, events, true)
	if err != nil {
		return nil, err
	}
	r.parts = parts
	return r, nil
}

// route queues the shares of events. With first, an error of this node's
// own share (other than a refusal) fails the whole batch before anything
// is forwarded.
func (c *clusterNode) route(ctx context.Context, h *actors.Host, pipeline string, events []*fold.Event, first bool) ([]*part, error) {
	v := c.view.Load()
	// Each owner's events, by key group, in batch order.
	type groupEvents struct {
		events []*fold.Event
		bytes  int
	}
	var owners []string
	byGroup := map[string]map[uint32]*groupEvents{}
	groupOrder := map[string][]uint32{}
	for _, ev := range events {
		g := actors.GroupOf(pipeline, ev.Key, c.groups)
		o := v.a.Owner(g)
		if byGroup[o] == nil {
			byGroup[o] = map[uint32]*groupEvents{}
			owners = append(owners, o)
		}
		ge := byGroup[o][g]
		if ge == nil {
			ge = &groupEvents{}
			byGroup[o][g] = ge
			groupOrder[o] = append(groupOrder[o], g)
		}
		ge.events = append(ge.events, ev)
		ge.bytes += len(ev.Raw)
	}
	// A remote share goes in messages the owner accepts (they frame events
	// less tightly than a JSON body), each refused or logged whole: a piece
	// holds whole key groups where it can, so that a refused piece, routed
	// again, holds every event of its keys (their order kept).
	// This node's share first, so that a batch it cannot take (draining,
	// unknown pipeline) fails before any share leaves.
	if i := slices.Index(owners, c.self); i > 0 {
		owners[0], owners[i] = owners[i], owners[0]
	}
	var parts []*part
	for _, o := range owners {
		p := &part{owner: o}
		parts = append(parts, p)
		for _, g := range groupOrder[o] {
			ge := byGroup[o][g]
			if o != c.self && len(p.events) > 0 && p.bytes+ge.bytes > c.maxForward {
				p = &part{owner: o}
				parts = append(parts, p)
			}
			for _, ev := range ge.events {
				if o != c.self && len(p.events) > 0 && p.bytes+len(ev.Raw) > c.maxForward {
					p = &part{owner: o} // one group above the limit: split it
					parts = append(parts, p)
				}
				p.events = append(p.events, ev)
				p.bytes += len(ev.Raw)
			}
		}
	}
	for _, p := range parts {
		switch p.owner {
		case "":
			p.err = notServed(errors.New("no members"))
		case c.self:
			pend, err := h.SubmitEvents(ctx, pipeline, p.events)
			if err != nil && first && !errors.Is(err, actors.ErrNotServed) {
				return nil, err
			}
			p.local, p.err = pend, err
		default:
			raws := make([][]byte, len(p.events))
			for i, ev := range p.events {
				raws[i] = ev.Raw
			}
			s, err := c.peers.Forward(ctx, p.owner, pipeline, raws)
			switch {
			case errors.Is(err, cluster.ErrNotSent):
				err = notServed(err)
			case err != nil && ctx.Err() == nil:
				err = fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
			}
			p.remote, p.err = s, err
			c.forwarded.Add(int64(len(raws)))
		}
		first = false
	}
	return parts, nil
}

// Wait waits for every share. Refused shares (nothing of them logged) are
// routed again with the next member list, for up to rerouteFor, unless
// another share failed: then the caller retries the batch, and a share
// applied meanwhile would count twice.
func (r *routedIngest) Wait(ctx context.Context) (IngestResult, error) {
	var res IngestResult
	parts := r.parts
	backoff := rerouteBackoff
	for {
		var again []*fold.Event
		var failed, refused error
		for _, p := range parts {
			acc, dups, err := p.wait(ctx)
			switch {
			case err == nil:
				res.Accepted += acc
				res.Duplicates += dups
			case errors.Is(err, actors.ErrNotServed):
				again = append(again, p.events...)
				refused = err
			case failed == nil:
				failed = err
			}
		}
		switch {
		case failed != nil:
			return res, failed
		case len(again) == 0:
			return res, nil
		case time.Since(r.start) > rerouteFor:
			return res, refused
		}
		r.c.rerouted.Add(int64(len(again)))
		if !r.c.awaitChange(ctx, r.c.view.Load(), &backoff) {
			return res, ctx.Err()
		}
		var err error
		if parts, err = r.c.route(ctx, r.h, r.pipeline, again, false); err != nil {
			return res, err
		}
	}
}

func (p *part) wait(ctx context.Context) (accepted, duplicates int, err error) {
	switch {
	case p.err != nil:
		return 0, 0, p.err
	case p.local != nil:
		r, err := p.local.Wait(ctx)
		return r.Accepted, r.Duplicates, err
	}
	fr, err := p.remote.Wait(ctx)
	switch {
	case errors.Is(err, cluster.ErrNotSent):
		return 0, 0, notServed(err)
	case err != nil:
		if ctx.Err() != nil {
			return 0, 0, err
		}
		return 0, 0, fmt.Errorf("%w: the outcome is unknown: %w", actors.ErrUnavailable, err)
	case fr.Refused:
		return 0, 0, notServed(fmt.Errorf("%s: %s", p.owner, fr.GetError().GetMessage()))
	case fr.Error != nil:
		return 0, 0, remoteError(p.owner, codes.Code(fr.Error.Code), fr.Error.Message)
	}
	return int(fr.Accepted), int(fr.Duplicates), nil
}

// notServed marks a share that nothing of was logged (refused, or never
// sent): the caller routes it again, or answers 503 if it gives up.
func notServed(err error) error {
	return fmt.Errorf("%w: %w: %w", actors.ErrNotServed, actors.ErrUnavailable, err)
}

// remoteError is an owner's error as this node's callers see it.
func remoteError(owner string, code codes.Code, msg string) error {
	switch code {
	case codes.Canceled:
		return fmt.Errorf("key group owner %s: %w", owner, context.Canceled)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.FailedPrecondition:
		return fmt.Errorf("%w: key group owner %s: %s", actors.ErrUnavailable, owner, msg)
	case codes.ResourceExhausted:
		return fmt.Errorf("%w: key group owner %s: %s", services.ErrBusy, owner, msg)
	case codes.InvalidArgument, codes.NotFound, codes.Unimplemented:
		// Valid here: the owner's configuration (or version) differs.
		return fmt.Errorf("keyfold: key group owner %s refused the call (is its configuration the same?): %s: %s", owner, code, msg)
	}
	return fmt.Errorf("keyfold: key group owner %s failed: %s: %s", owner, code, msg)
}

// retry calls fn with the owner of a key until it succeeds, fails for good,
// or rerouteFor passes: fn reports whether its error is worth routing again
// (the owner changed, or does not serve the group yet).
func (c *clusterNode) retry(ctx context.Context, pipeline, key string, fn func(owner string) (again bool, err error)) error {
	start, backoff := time.Now(), rerouteBackoff
	for {
		owner, v := c.ownerOf(pipeline, key)
		again, err := fn(owner)
		if !again || time.Since(start) > rerouteFor {
			return err
		}
		if !c.awaitChange(ctx, v, &backoff) {
			return err
		}
	}
}

// awaitChange waits before a call is routed again: until the member list
// changes (v is the one the call was routed with; the renew loop is asked
// to read it now) or the backoff passes, which it then doubles. False if
// ctx ended.
func (c *clusterNode) awaitChange(ctx context.Context, v *view, backoff *time.Duration) bool {
	c.askRefresh()
	t := time.NewTimer(*backoff)
	defer t.Stop()
	*backoff = min(2**backoff, maxRerouteBackoff)
	select {
	case <-v.next:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// retryable reports whether a remote call's error is worth routing again.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unavailable:
		return true
	}
	return false
}

func (c *clusterNode) query(ctx context.Context, h *actors.Host, pipeline, key string) (KeyState, error) {
	var ks KeyState
	err := c.retry(ctx, pipeline, key, func(owner string) (bool, error) {
		if owner == c.self {
			var err error
			ks, err = c.n.queryLocal(ctx, h, pipeline, key)
			return errors.Is(err, actors.ErrUnavailable), err
		}
		cl, err := c.peers.Client(owner)
		if err != nil {
			return true, fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
		}
		resp, err := cl.GetState(ctx, &keyfoldv1.GetStateRequest{Pipeline: pipeline, Key: key})
		if err != nil {
			st := status.Convert(err)
			if st.Code() == codes.NotFound && !strings.Contains(st.Message(), "unknown pipeline") {
				return false, fmt.Errorf("%w: %q in pipeline %q", ErrNotFound, key, pipeline)
			}
			return retryable(err), remoteError(owner, st.Code(), st.Message())
		}
		ks, err = decodeState(resp, c.n.cfg.Pipelines[pipeline])
		return false, err
	})
	return ks, err
}

func (c *clusterNode) delete(ctx context.Context, h *actors.Host, pipeline, key string) error {
	return c.retry(ctx, pipeline, key, func(owner string) (bool, error) {
		// Routed again only when refused (nothing logged): a deletion
		// logged with an unknown outcome and sent again would erase what
		// was acknowledged in between.
		if owner == c.self {
			err := h.Delete(ctx, pipeline, key)
			return errors.Is(err, actors.ErrNotServed), err
		}
		cl, err := c.peers.Client(owner)
		if err != nil {
			return errors.Is(err, cluster.ErrNotSent), fmt.Errorf("%w: %w", actors.ErrUnavailable, err)
		}
		if _, err := cl.DeleteKey(ctx, &keyfoldv1.DeleteKeyRequest{Pipeline: pipeline, Key: key}); err != nil {
			st := status.Convert(err)
			return st.Code() == codes.FailedPrecondition, remoteError(owner, st.Code(), st.Message())
		}
		return false, nil
	})
}

// decodeState is the owner's answer as a KeyState, with the aggregates'
// values of the types a local query gives (spec names their ops).
func decodeState(resp *keyfoldv1.GetStateResponse, spec PipelineConfig) (KeyState, error) {
	ks := KeyState{Pipeline: resp.Pipeline, Key: resp.Key, Seq: resp.Seq, Duplicates: resp.Duplicates,
		Aggregates: make(map[string]any, len(resp.Aggregates))}
	for name, b := range resp.Aggregates {
		v, err := aggregateValue(spec.Aggregates[name].Op, b)
		if err != nil {
			return KeyState{}, fmt.Errorf("keyfold: owner's aggregate %q: %w", name, err)
		}
		ks.Aggregates[name] = v
	}
	if len(resp.TimeJson) > 0 {
		var t timeState
		if err := json.Unmarshal(resp.TimeJson, &t); err != nil {
			return KeyState{}, fmt.Errorf("keyfold: owner's windows: %w", err)
		}
		ks.Watermark, ks.Late, ks.Windows, ks.Patterns, ks.LateWindows = t.Watermark, t.Late, t.Windows, t.Patterns, t.LateWindows
		if ks.Windows == nil {
			ks.Windows = []WindowState{}
		}
	}
	return ks, nil
}

// aggregateValue decodes an aggregate's JSON value to the type the fold
// gives it: counts uint64, last the raw JSON, numbers float64.
func aggregateValue(op string, b []byte) (any, error) {
	if string(b) == "null" {
		return nil, nil
	}
	switch op {
	case "count", "distinct":
		var u uint64
		err := json.Unmarshal(b, &u)
		return u, err
	case "last":
		if !json.Valid(b) {
			return nil, errors.New("invalid JSON")
		}
		return json.RawMessage(slices.Clone(b)), nil
	}
	var v any
	err := json.Unmarshal(b, &v)
	return v, err
}

// timeState is a key's event-time state as the gRPC API encodes it.
type timeState struct {
	Watermark *time.Time     `json:"watermark,omitempty"`
	Late      *uint64        `json:"late"`
	Windows   []WindowState  `json:"windows"`
	Patterns  []PatternState `json:"patterns,omitempty"`
	// LateWindows: see KeyState.
	LateWindows map[string]uint64 `json:"late_windows,omitempty"`
}

// ClusterInfo describes the cluster as a node sees it (GET /v1/cluster).
type ClusterInfo struct {
	// Cluster is the cluster's name ("" for a node alone).
	Cluster string `json:"cluster,omitempty"`
	// Self is this node's member id (its advertised gRPC address).
	Self      string `json:"self"`
	KeyGroups uint32 `json:"key_groups"`
	// Membership is "redis" (leases), "static" or "single".
	Membership string `json:"membership"`
	// FailureDetection is how long a member that stopped answering stays
	// listed (the lease).
	FailureDetection string       `json:"failure_detection,omitempty"`
	Members          []MemberInfo `json:"members"`
	// Key, when asked for, is the owner of one key.
	Key *KeyOwner `json:"key,omitempty"`
}

// MemberInfo is one member, as it answered (State "unreachable" if not).
type MemberInfo struct {
	ID string `json:"id"`
	// "joining" (taking over its groups), "serving", "draining" or
	// "unreachable".
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// GroupsAssigned is the placement's share of the member (as this node
	// computes it); GroupsOwned and GroupsServing what the member holds.
	GroupsAssigned  int       `json:"groups_assigned"`
	GroupsOwned     uint32    `json:"groups_owned"`
	GroupsServing   uint32    `json:"groups_serving"`
	ActiveKeys      uint64    `json:"active_keys"`
	Events          uint64    `json:"events"`
	EventsForwarded uint64    `json:"events_forwarded"`
	EventsReceived  uint64    `json:"events_received"`
	HTTPAddr        string    `json:"http_addr,omitempty"`
	Started         time.Time `json:"started,omitzero"`
}

// KeyOwner names the member that owns a key's group.
type KeyOwner struct {
	Pipeline string `json:"pipeline"`
	Key      string `json:"key"`
	Group    uint32 `json:"group"`
	Owner    string `json:"owner"`
}

// status describes this node.
func (n *Node) status() *keyfoldv1.NodeStatus {
	st := &keyfoldv1.NodeStatus{Id: n.memberID(), State: "joining", HttpAddr: n.HTTPAddr(), StartedMs: n.startedAt.UnixMilli()}
	h := n.host.Load()
	if h == nil {
		return st
	}
	hs := h.Stats()
	owned := len(h.Owned())
	st.GroupsOwned, st.GroupsServing = uint32(owned), uint32(max(owned-hs.GroupsUnavailable, 0)) // two reads: clamp
	st.ActiveKeys, st.Events = uint64(hs.ActiveKeys), uint64(hs.Events)
	c := n.clu.Load()
	switch {
	case n.draining.Load():
		st.State = "draining"
	case c == nil || isClosed(c.joined):
		st.State = "serving"
	}
	if c != nil {
		st.EventsForwarded, st.EventsReceived = uint64(c.forwarded.Load()), uint64(c.received.Load())
	}
	return st
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (n *Node) memberID() string {
	if c := n.clu.Load(); c != nil {
		return c.self
	}
	return n.GRPCAddr()
}

// Cluster describes the cluster: its members with their key groups, keys
// and activity, and, if key is set, the owner of pipeline's key. A node
// alone is a cluster of one.
func (n *Node) Cluster(ctx context.Context, pipeline, key string) (ClusterInfo, error) {
	if key != "" {
		if pipeline == "" && len(n.pipelines) == 1 {
			for p := range n.pipelines {
				pipeline = p
			}
		}
		if _, ok := n.pipelines[pipeline]; !ok {
			return ClusterInfo{}, fmt.Errorf("%w %q (name it with ?pipeline=)", ErrUnknownPipeline, pipeline)
		}
		if err := fold.CheckKey(key); err != nil {
			return ClusterInfo{}, err
		}
	}
	info := ClusterInfo{Self: n.memberID(), KeyGroups: n.cfg.KeyGroups, Membership: "single"}
	c := n.clu.Load()
	if c == nil && n.cfg.Cluster != "" {
		return info, ErrNotReady // not started yet
	}
	if c == nil {
		st := n.status()
		info.Members = []MemberInfo{memberInfo(st, int(n.cfg.KeyGroups))}
		if key != "" {
			info.Key = &KeyOwner{pipeline, key, actors.GroupOf(pipeline, key, n.cfg.KeyGroups), info.Self}
		}
		return info, nil
	}
	info.Cluster, info.Membership = c.name, c.membership()
	if c.reg != nil {
		info.FailureDetection = c.lease.String()
	}
	v := c.view.Load()
	if v == nil {
		return info, ErrNotReady
	}
	info.Members = make([]MemberInfo, len(v.a.Members))
	var wg sync.WaitGroup
	for i, m := range v.a.Members {
		wg.Go(func() {
			assigned := len(v.a.Groups(m))
			if m == c.self {
				info.Members[i] = memberInfo(n.status(), assigned)
				return
			}
			mi := MemberInfo{ID: m, State: "unreachable", GroupsAssigned: assigned}
			cl, err := c.peers.Client(m)
			if err == nil {
				sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				var st *keyfoldv1.NodeStatus
				st, err = cl.Status(sctx, &keyfoldv1.NodeStatusRequest{})
				cancel()
				if err == nil {
					mi = memberInfo(st, assigned)
				}
			}
			if err != nil {
				mi.Error = status.Convert(err).Message()
			}
			info.Members[i] = mi
		})
	}
	wg.Wait()
	if key != "" {
		g := actors.GroupOf(pipeline, key, n.cfg.KeyGroups)
		info.Key = &KeyOwner{pipeline, key, g, v.a.Owner(g)}
	}
	return info, nil
}

func memberInfo(st *keyfoldv1.NodeStatus, assigned int) MemberInfo {
	mi := MemberInfo{
		ID: st.Id, State: st.State, GroupsAssigned: assigned, GroupsOwned: st.GroupsOwned, GroupsServing: st.GroupsServing,
		ActiveKeys: st.ActiveKeys, Events: st.Events, EventsForwarded: st.EventsForwarded, EventsReceived: st.EventsReceived,
		HTTPAddr: st.HttpAddr,
	}
	if st.StartedMs > 0 {
		mi.Started = time.UnixMilli(st.StartedMs).UTC()
	}
	return mi
}

// localBackend serves the node-to-node service: this node's groups only.
type localBackend struct{ n *Node }

func (b localBackend) SubmitLocal(ctx context.Context, from, pipeline string, raws [][]byte) (grpcapi.Pending, error) {
	h, err := b.n.serving(pipeline)
	if err != nil {
		return nil, err
	}
	p, err := h.Submit(ctx, pipeline, raws)
	if err != nil {
		return nil, err
	}
	if c := b.n.clu.Load(); c != nil {
		c.received.Add(int64(len(raws)))
	}
	return grpcPending{&PendingIngest{p: p}}, nil
}

func (b localBackend) QueryLocal(ctx context.Context, pipeline, key string) (grpcapi.KeyState, error) {
	h, err := b.n.serving(pipeline)
	if err != nil {
		return grpcapi.KeyState{}, err
	}
	st, err := b.n.queryLocal(ctx, h, pipeline, key)
	return grpcState(st), err
}

func (b localBackend) DeleteLocal(ctx context.Context, pipeline, key string) error {
	h, err := b.n.serving(pipeline)
	if err != nil {
		return err
	}
	return h.Delete(ctx, pipeline, key)
}

func (b localBackend) Status(context.Context) *keyfoldv1.NodeStatus { return b.n.status() }

func (b localBackend) MembersChanged(from string, leaving bool) {
	if c := b.n.clu.Load(); c != nil {
		if leaving {
			c.leaving.Store(from, time.Now())
		}
		c.askRefresh()
	}
}

func (b localBackend) Released(from string, groups []uint32) {
	if c := b.n.clu.Load(); c != nil {
		c.noteReleased(from, groups)
	}
}

// sleepCtx sleeps for d or until ctx ends; false if ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// validAdvertise checks a member id: host:port with a specific host.
func validAdvertise(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if port == "0" || port == "" {
		return fmt.Errorf("advertise %q needs a port", addr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" || strings.ContainsAny(addr, " \t\r\n") {
		return fmt.Errorf("advertise %q must name a host the other nodes can reach", addr)
	}
	return nil
}

// clusterStats are the node's cluster counters (a node alone: one member
// owning every group).
func (n *Node) clusterStats() metrics.ClusterStats {
	c := n.clu.Load()
	if c == nil {
		return metrics.ClusterStats{Members: 1, GroupsOwned: int(n.cfg.KeyGroups)}
	}
	st := metrics.ClusterStats{GroupsMoved: c.moved.Load(), EventsForwarded: c.forwarded.Load(),
		EventsReceived: c.received.Load(), EventsRerouted: c.rerouted.Load()}
	if v := c.view.Load(); v != nil {
		st.Members, st.GroupsOwned = len(v.a.Members), len(v.a.Groups(c.self))
	}
	return st
}
