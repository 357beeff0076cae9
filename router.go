package keyfold

import (
	"context"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/cluster"
	"github.com/keyfold/keyfold/persistence"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// router is where the façade (Node and its transports) sends every call
// that depends on where a key's group is served: to this node's host (a
// node alone: localRouter), or through the cluster (*cluster.Node), which
// splits a batch by owner, forwards the shares and routes refused ones
// again, and sends queries and deletions to the key's owner.
type router interface {
	// Routable reports whether calls can be routed yet: a member needs a
	// member list first. Until then they are ErrNotReady.
	Routable() bool

	// Submit validates a batch and queues it for logging (its shares with
	// their owners); Query reads a key's state and Delete erases a key, at
	// its owner.
	Submit(ctx context.Context, pipeline string, events [][]byte) (actors.Pending, error)
	Query(ctx context.Context, pipeline, key string) (actors.KeyView, error)
	Delete(ctx context.Context, pipeline, key string) error
	// Call calls a key's handler at its owner.
	Call(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error)

	// The node-to-node service's calls (localBackend): on this node's
	// groups only, never forwarded further; and the other members' notices.
	SubmitLocal(ctx context.Context, from string, batch *keyfoldv1.ForwardBatch) (actors.Pending, error)
	QueryLocal(ctx context.Context, pipeline, key string) (actors.KeyView, error)
	CallLocal(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error)
	MembersChanged(from string, leaving bool)
	Released(from string, groups []uint32)

	// Self is the node's member id; Joined reports whether it serves its
	// share of the key groups; Stats are its cluster counters and Info
	// describes the cluster, with the owner of pipeline's key if key is
	// set (both checked).
	Self() string
	Joined() bool
	Stats() cluster.Stats
	Info(ctx context.Context, pipeline, key string) (cluster.Info, error)
}

var (
	_ router = (*cluster.Node)(nil)
	_ router = localRouter{}
)

// router returns where calls go: the cluster once a member's has started,
// else this node's host. (A member's host is published after its cluster,
// so the host serves no call of a member before the cluster routes it.)
func (n *Node) router() router {
	if c := n.clu.Load(); c != nil {
		return c
	}
	return localRouter{n}
}

// newCluster returns the membership of a node configured for a cluster,
// for its host h (which serves no group until placement gives it some).
func (n *Node) newCluster(store persistence.Store, h *actors.Host) (*cluster.Node, error) {
	self := n.cfg.Advertise
	if self == "" {
		self = n.GRPCAddr() // Validate made sure its host is specific
	}
	return cluster.New(cluster.Config{
		Name:            n.cfg.Cluster,
		Self:            self,
		Groups:          n.keyGroups(),
		Peers:           n.cfg.Peers,
		Lease:           n.cfg.ClusterLease,
		Store:           store,
		TLSCert:         n.cfg.GRPCTLSCert,
		MaxMessageBytes: int(n.cfg.MaxBodyBytes),
		Pipelines:       n.pipelines,
		Specs:           n.cfg.Pipelines,
		Status:          n.status,
		Logger:          n.cfg.Logger,
	}, h)
}

// localRouter serves every call with this node's host: a node alone owns
// every key group. (It stands in for a member's cluster until that
// starts: then it serves no call, as the host is not there yet.) The calls
// on keys come after Node.serving found the host.
type localRouter struct{ n *Node }

func (l localRouter) Routable() bool { return true }

func (l localRouter) Submit(ctx context.Context, pipeline string, events [][]byte) (actors.Pending, error) {
	return l.n.host.Load().Submit(ctx, pipeline, events)
}

func (l localRouter) Query(ctx context.Context, pipeline, key string) (actors.KeyView, error) {
	return l.n.host.Load().Query(ctx, pipeline, key)
}

func (l localRouter) Delete(ctx context.Context, pipeline, key string) error {
	return l.n.host.Load().Delete(ctx, pipeline, key)
}

func (l localRouter) Call(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error) {
	return l.n.host.Load().Call(ctx, pipeline, key, req, o)
}

// SubmitLocal: a node alone has no members to take at their word.
func (l localRouter) SubmitLocal(ctx context.Context, _ string, batch *keyfoldv1.ForwardBatch) (actors.Pending, error) {
	return l.Submit(ctx, batch.Pipeline, batch.Events)
}

func (l localRouter) QueryLocal(ctx context.Context, pipeline, key string) (actors.KeyView, error) {
	return l.Query(ctx, pipeline, key)
}

func (l localRouter) CallLocal(ctx context.Context, pipeline, key string, req []byte, o actors.CallOptions) (fold.Reply, error) {
	return l.Call(ctx, pipeline, key, req, o)
}

// MembersChanged and Released: a node alone has no placement to change.
func (localRouter) MembersChanged(string, bool) {}
func (localRouter) Released(string, []uint32)   {}

func (l localRouter) Self() string { return l.n.GRPCAddr() }
func (localRouter) Joined() bool   { return true }

// Stats: one member owning every group.
func (l localRouter) Stats() cluster.Stats {
	return cluster.Stats{Members: 1, GroupsOwned: int(l.n.keyGroups())}
}

// Info: a cluster of one, or ErrNotReady for a member not started yet.
func (l localRouter) Info(_ context.Context, pipeline, key string) (cluster.Info, error) {
	info := cluster.Info{Self: l.Self(), KeyGroups: l.n.keyGroups(), Membership: "single"}
	if l.n.cfg.Cluster != "" {
		return info, ErrNotReady
	}
	info.Members = []cluster.MemberInfo{cluster.NewMemberInfo(l.n.status(), int(l.n.keyGroups()))}
	if h := l.n.host.Load(); key != "" && h != nil { // the layout is known once the host recovered
		info.Key = &cluster.KeyOwner{Pipeline: pipeline, Key: key, Group: h.GroupOf(pipeline, key), Owner: info.Self}
	}
	return info, nil
}
