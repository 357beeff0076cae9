package cluster

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold/actors"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Info describes the cluster as a node sees it (GET /v1/cluster).
type Info struct {
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

// NewMemberInfo describes a member by its status, given the number of
// groups the placement assigns it.
func NewMemberInfo(st *keyfoldv1.NodeStatus, assigned int) MemberInfo {
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

// Info describes the cluster: its members with their key groups, keys and
// activity (each other member asked for its status), and, if key is set,
// the owner of pipeline's key (both checked by the caller). Before the
// node has a member list it is ErrNotReady.
func (c *Node) Info(ctx context.Context, pipeline, key string) (Info, error) {
	info := Info{Cluster: c.name, Self: c.self, KeyGroups: c.groups, Membership: c.membership()}
	if c.reg != nil {
		info.FailureDetection = c.lease.String()
	}
	v := c.view.Load()
	if v == nil {
		return info, actors.ErrNotReady
	}
	info.Members = make([]MemberInfo, len(v.a.Members))
	var wg sync.WaitGroup
	for i, m := range v.a.Members {
		wg.Go(func() {
			assigned := len(v.a.Groups(m))
			if m == c.self {
				info.Members[i] = NewMemberInfo(c.status(), assigned)
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
					mi = NewMemberInfo(st, assigned)
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
		g := c.host.GroupOf(pipeline, key)
		info.Key = &KeyOwner{pipeline, key, g, v.a.Owner(g)}
	}
	return info, nil
}

// Stats are a member's cluster counters.
type Stats struct {
	Members         int   // live members this node sees (1 for a node alone)
	GroupsOwned     int   // key groups placement gives this node
	GroupsMoved     int64 // key groups whose owner changed, over the member lists seen
	EventsForwarded int64 // events sent to their owner
	EventsReceived  int64 // events received from other members
	EventsRerouted  int64 // events routed again: their owner did not serve their group yet
}

// Stats returns the node's cluster counters.
func (c *Node) Stats() Stats {
	st := Stats{GroupsMoved: c.moved.Load(), EventsForwarded: c.forwarded.Load(),
		EventsReceived: c.received.Load(), EventsRerouted: c.rerouted.Load()}
	if v := c.view.Load(); v != nil {
		st.Members, st.GroupsOwned = len(v.a.Members), len(v.a.Groups(c.self))
	}
	return st
}
