package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Node is a node's membership in a cluster: it keeps the member list and
// the placement, makes the host serve this node's key groups (see the
// package doc for the order of its steps), and routes the node's calls to
// the owners of their keys.
type Node struct {
	host      Host
	name      string
	self      string
	groups    uint32
	lease     time.Duration
	reg       *Registry // nil with a static member list
	static    Static
	peers     *Peers
	pipelines map[string]*fold.Pipeline
	specs     map[string]fold.Spec
	status    func() *keyfoldv1.NodeStatus
	log       *slog.Logger

	view     atomic.Pointer[view]
	applied  atomic.Pointer[Assignment] // the last placement fully applied
	refresh  chan struct{}              // asks the renew loop to renew now
	regMu    sync.Mutex                 // a renewal, or setting left and deregistering
	left     atomic.Bool                // deregistered: the renew loop only reads
	notices  sync.WaitGroup             // notices to members in flight
	leaving  sync.Map                   // member id → when it said it was leaving
	joined   chan struct{}              // closed once the node serves its first placement
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

// view is a member list and its placement, as this node saw it.
type view struct {
	a    Assignment
	prev Assignment // the placement before it
	at   time.Time
	next chan struct{} // closed when a newer view replaces this one
}

// New returns the membership of a node whose host h serves no key group
// yet (actors.Config.Owned empty): Join starts it. It reads the TLS
// certificate, if any, and starts nothing.
func New(cfg Config, h Host) (*Node, error) {
	c := &Node{
		host: h, name: cfg.Name, self: cfg.Self, groups: cfg.Groups, lease: cfg.Lease,
		pipelines: cfg.Pipelines, specs: cfg.Specs, status: cfg.Status,
		log: cfg.Logger.With("cluster", cfg.Name), refresh: make(chan struct{}, 1), joined: make(chan struct{}),
		released: map[uint32]releaseNote{}, releasedCh: make(chan struct{}, 1), base: time.Now(),
		// Half the receivers' message limit: room for the framing of many
		// small events.
		maxForward: cfg.MaxMessageBytes / 2,
	}
	if len(cfg.Peers) > 0 {
		c.static = Static(cfg.Peers)
		if !slices.Contains(cfg.Peers, c.self) {
			return nil, fmt.Errorf("keyfold: cluster: peers %v do not include this node's address %s", cfg.Peers, c.self)
		}
	} else {
		rs, ok := cfg.Store.(interface {
			Client() redis.UniversalClient
			Prefix() string
		})
		if !ok {
			return nil, errors.New("keyfold: cluster: membership needs a Redis store, or a static list of peers")
		}
		c.reg = NewRegistry(rs.Client(), rs.Prefix()+":cluster:"+cfg.Name, cfg.Lease)
		c.lease = c.reg.Lease()
	}
	if c.lease <= 0 {
		c.lease = DefaultLease
	}
	dial, err := cfg.dialOptions()
	if err != nil {
		return nil, err
	}
	c.peers = NewPeers(c.self, c.maxForward, c.reg != nil, c.log, dial...)
	return c, nil
}

// renewInterval is how often the lease is renewed and the list read.
func (c *Node) renewInterval() time.Duration { return c.lease / 3 }

// Join starts the membership and placement loops and waits until the node
// serves its first placement (or ctx ends, or the host fails).
func (c *Node) Join(ctx context.Context) error {
	rctx, stopRenew := context.WithCancel(context.Background())
	actx, stopApply := context.WithCancel(context.Background())
	c.stopRenew, c.renewDone = stopRenew, make(chan struct{})
	c.stopApply, c.applyDone = stopApply, make(chan struct{})
	go c.renewLoop(rctx)
	go c.applyLoop(actx)
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
			if err := c.host.Err(); err != nil {
				return err
			}
		}
	}
}

// Joined reports whether the node serves its share: it has applied its
// first placement.
func (c *Node) Joined() bool {
	select {
	case <-c.joined:
		return true
	default:
		return false
	}
}

func (c *Node) membership() string {
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
// abandons them all at once, without writing (lapse), and takes its share
// back through the hand-off a joining node goes through (observe).
//
// Each renewal whose member list the node acts on confirms its lease for
// reads, as of when the renewal was sent (see checkRead).
func (c *Node) renewLoop(ctx context.Context) {
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
				c.observe(members, rejoin)
				rejoin = false
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
				c.observe(without(cur.a.Members, c.self), false)
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
func (c *Node) members(ctx context.Context) ([]string, bool, error) {
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
func (c *Node) lapse(held bool, gap time.Duration) {
	c.confirmed.Store(0)
	c.log.Warn("membership lease lapsed: abandoning every key group, then taking this node's share back as a joining member",
		"since_last_renewal", gap.Round(time.Millisecond), "lease", c.lease, "ran_out_in_store", !held)
	c.host.Abandon(errLeaseLapsed)
}

// confirm records that the lease was live at the store when a renewal sent
// at began reached it, and that its member list is the node's view.
func (c *Node) confirm(began time.Time) {
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
func (c *Node) readLease() time.Duration { return c.renewInterval() + handoffMargin/2 }

// errLeaseUnconfirmed refuses a read from memory: the node's lease was not
// confirmed by the store recently enough (see readLease).
var errLeaseUnconfirmed = errors.New("keyfold: cluster: membership lease not confirmed recently")

// checkRead returns nil if this node may answer a query for a key of
// group g from its memory now: its lease was confirmed within readLease
// and its view gives it the group. Otherwise it returns a refusal (not
// served, unavailable), which routes the query again. With a static member
// list nothing moves and there is nothing to check.
func (c *Node) checkRead(g uint32) error {
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
func (c *Node) askRefresh() {
	select {
	case c.refresh <- struct{}{}:
	default:
	}
}

// observe publishes a member list if it changed. A node that joins (its
// first list), or joins again (rejoin: its lease lapsed and it abandoned
// its groups), holds nothing, and the others are taken to hold its share:
// each of its groups is taken over once its holder says it released it,
// or a renew period later, and the others are asked to read the list now
// so that they release its share at once rather than at their next
// renewal.
func (c *Node) observe(members []string, rejoin bool) {
	cur := c.view.Load()
	if !rejoin && cur != nil && slices.Equal(cur.a.Members, members) {
		return
	}
	v := &view{a: Assign(members, c.groups), at: time.Now(), next: make(chan struct{})}
	joining := cur == nil || rejoin
	switch {
	case joining:
		v.prev = Assign(without(members, c.self), c.groups)
		msg := "members"
		if rejoin {
			// Before the view: its apply starts from here, not from the
			// placement applied before the lapse.
			c.applied.Store(&v.prev)
			msg = "members after the lease lapsed"
		}
		c.log.Info(msg, "members", members, "groups_here", len(v.a.Groups(c.self)))
	default:
		v.prev = cur.a
		joined, left := diff(cur.a.Members, members)
		moved := len(Moved(cur.a, v.a))
		c.moved.Add(int64(moved))
		attrs := []any{"members", len(members), "joined", joined, "left", left,
			"groups_moved", moved, "groups_here", len(v.a.Groups(c.self))}
		if failed := c.unannounced(left); len(failed) > 0 {
			// Dropped without saying goodbye: killed, hung or cut off, and
			// detected by its lease running out.
			attrs = append(attrs, "failed", failed)
		}
		c.log.Info("members changed", attrs...)
	}
	c.view.Store(v)
	if cur != nil {
		close(cur.next)
	}
	// After the view: a call routed with the old one to a departed member
	// gets ErrNotSent and is routed again with this one.
	c.peers.Retain(members)
	if joining {
		c.tellMembersChanged(members, false)
	}
}

// without returns a copy of members without m.
func without(members []string, m string) []string {
	return slices.DeleteFunc(slices.Clone(members), func(x string) bool { return x == m })
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
func (c *Node) applyLoop(ctx context.Context) {
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
		c.apply(vctx, v)
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

// apply makes the host serve v's groups for this node, in the hand-off
// order of the package doc: release what v takes away (and tell the new
// owners), take over at once what no live member holds, then the rest as
// each holder says it released it, or once the deadline passes.
func (c *Node) apply(ctx context.Context, v *view) {
	// Who holds a group now is the owner in the last placement applied
	// here, not in the previous view: that one may have been replaced
	// before this node acted on it.
	prev := v.prev
	applied := c.applied.Load()
	if applied != nil {
		prev = *applied
	}
	mine := v.a.Groups(c.self)
	owned := c.host.Owned()
	keep := intersect(owned, mine)
	if len(keep) < len(owned) {
		if c.setOwned(ctx, keep) {
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
		if !c.setOwned(ctx, keep) {
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
			if !c.setOwned(ctx, keep) {
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
		if !c.setOwned(ctx, mine) {
			return
		}
		break
	}
	if ctx.Err() == nil {
		// Unless a lapsed lease reset it meanwhile (observe).
		c.applied.CompareAndSwap(applied, &v.a)
		c.joinOnce.Do(func() { close(c.joined) })
	}
}

// setOwned applies groups to the host; false if ctx ended first.
func (c *Node) setOwned(ctx context.Context, groups []uint32) bool {
	if err := c.host.SetOwned(ctx, groups); err != nil {
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

// Leave hands the node's groups over and deregisters: it stops applying
// placements, releases every group (stores results, checkpoints), then
// drops its lease, so the next owners take over at once and replay next to
// nothing. The renew loop goes on reading the list, so that calls still
// in flight here are routed to the new owners. Call it after Join.
func (c *Node) Leave(ctx context.Context) {
	start := time.Now()
	c.stopApply()
	<-c.applyDone
	// A failed host writes nothing more (its memory may not match its
	// log): its groups' next owners replay them.
	if c.host.Err() == nil {
		if err := c.host.SetOwned(ctx, nil); err != nil {
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

// Stop ends the membership loops and closes the peer connections.
func (c *Node) Stop() {
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
