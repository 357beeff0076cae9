package keyfold

import (
	"context"
	"fmt"

	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/cluster"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// ClusterInfo describes the cluster as a node sees it (GET /v1/cluster).
type ClusterInfo = cluster.Info

// MemberInfo is one member, as it answered (State "unreachable" if not).
type MemberInfo = cluster.MemberInfo

// KeyOwner names the member that owns a key's group.
type KeyOwner = cluster.KeyOwner

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
	return n.router().Info(ctx, pipeline, key)
}

// status describes this node, as its Status call (node to node) answers.
func (n *Node) status() *keyfoldv1.NodeStatus {
	r := n.router()
	st := &keyfoldv1.NodeStatus{Id: r.Self(), State: "joining", HttpAddr: n.HTTPAddr(), StartedMs: n.startedAt.UnixMilli()}
	h := n.host.Load()
	if h == nil {
		return st
	}
	hs := h.Stats()
	owned := len(h.Owned())
	st.GroupsOwned, st.GroupsServing = uint32(owned), uint32(max(owned-hs.GroupsUnavailable, 0)) // two reads: clamp
	st.ActiveKeys, st.Events = uint64(hs.ActiveKeys), uint64(hs.Events)
	switch {
	case n.draining.Load():
		st.State = "draining"
	case r.Joined():
		st.State = "serving"
	}
	cs := r.Stats()
	st.EventsForwarded, st.EventsReceived = uint64(cs.EventsForwarded), uint64(cs.EventsReceived)
	return st
}
