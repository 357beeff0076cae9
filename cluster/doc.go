// Package cluster makes a node a member of a cluster: it keeps the member
// list, decides which member serves which key groups, hands groups over
// between members, and routes each call to the owner of its keys. The
// root package (keyfold.Node) starts a [Node] for a node configured with a
// cluster name and sends it every call; the node-to-node service it
// calls on the other members is keyfold.v1.Cluster
// (proto/keyfold/v1/cluster.proto), served by each member's root.
//
// Its parts:
//
//   - membership (members.go): each member holds a lease in Redis
//     ([Registry]) and renews it every lease/3, or reads a static list
//     ([Static]). A member whose lease runs out (killed, cut off) is gone.
//   - placement (placement.go): [Assign] gives every key group an owner
//     among the live members, by rendezvous hashing with bounded loads;
//     each change of the member list recomputes it.
//   - the placement loop (node.go): [Node] publishes each new member list
//     as a view and makes its host (an *actors.Host, seen through [Host])
//     serve the view's groups for this node, in the order below.
//   - hand-off notices (handoff.go): a member tells the new owners of the
//     groups it released ([Node.Released] at the receiver), and the others
//     that the list changed ([Node.MembersChanged]). They only hasten what
//     the next renewal brings about anyway.
//   - routing (route.go): a batch is validated whole, split by owner, its
//     own share queued with the host and each other share forwarded to its
//     owner ([Peers]: one Forward call in flight per owner, in order),
//     with what this node read of each event (fold's prepared encoding),
//     which the owner applies without parsing the events again when the
//     sender is a current member with the same pipeline, and validates
//     otherwise ([Node.SubmitLocal]). A share refused because its owner
//     does not serve the group yet (nothing of it was logged) is routed
//     again with the next member list. Queries and deletions go to the
//     key's owner; a key's state travels as the gRPC APIs'
//     GetStateResponse, encoded from the host's form of it
//     (actors.KeyView) and decoded back to it in one place (state.go).
//   - the cluster view (info.go): [Node.Info] asks every member for its
//     status (GET /v1/cluster), and [Node.Stats] counts what moved.
//
// Placement is an optimisation, never the safety mechanism: the store's
// epochs fence a stale owner of a group (see actors and persistence), so two
// members that briefly disagree about the member list slow each other down
// but never lose or double an acknowledged event. Placement only keeps the
// window of two owners short.
//
// # I/O order of a hand-off
//
// When a view moves a group from member A (still alive) to member B:
//
//  1. release: A stops serving the group (actors.Host.SetOwned): its new
//     inputs are refused as not served (nothing logged: the sender routes
//     them again), and the results its keys queued are stored;
//  2. checkpoint: A checkpoints the group and drops its keys from memory,
//     so that the next owner replays next to nothing;
//  3. notify: A tells B it released the group (Released);
//  4. take over: B claims the group in the store (bumping its epoch, which
//     fences A whatever the timing), replays its log above the checkpoint,
//     and serves it. B takes over on A's word, or at the latest a renew
//     interval and a margin after it saw the view, by when A has seen it
//     too. The groups of a member that is gone are taken over at once.
//
// A member's reads are served from memory only under a lease the store
// confirmed within a renew interval and half that margin (see checkRead),
// so that no other member can have taken the key's group over meanwhile.
//
// A joining member holds nothing and takes the others to hold its share:
// it tells them it is here (MembersChanged), they release its groups
// (1–3), and it takes each over (4). A member whose lease lapsed (it was
// paused, or cut off, for longer than a lease: the others may have taken
// its groups over) abandons every group without writing, then joins again
// in the same way. A member that cannot renew its lease for about a lease
// releases every group.
//
// # Leaving
//
// [Node.Leave]: the placement loop stops; every group is released and
// checkpointed (1–2, skipped by a failed host, whose memory may not match
// its log); then, with leases, the lease is dropped (Registry.Leave) and
// the others are told the member is leaving (MembersChanged), so that they
// see it gone at once, take its groups over at once (4) and replay next to
// nothing; the notices are awaited. The renew loop keeps reading the list
// so that calls still in flight are routed to the new owners, until
// [Node.Stop] ends it and closes the connections to the members.
//
// # Locks
//
// No mutex of this package is held while another is taken, nor while the
// host is called: Node.regMu (a renewal, or a leave's deregistration: the
// only one held across I/O, a Redis call bounded by its context),
// Node.releasedMu (the release notes), Peers.mu (the connections) and
// peer.mu (a peer's queue while it closes) are each a leaf. Everything
// else a Node shares between its loops and its callers is atomic or a
// channel: the view, the placement applied, the counters, the signals.
package cluster
