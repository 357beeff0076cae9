// Package cluster decides which node serves which key groups: membership
// (members register with leases in Redis, or a static list) and placement
// (rendezvous hashing of key groups over the live members).
//
// Placement is an optimisation, never the safety mechanism: the store's
// epochs fence a stale owner of a group (see actors and persistence), so two
// nodes that briefly disagree about the member list slow each other down but
// never lose or double an acknowledged event. Placement only keeps the
// window of two owners short.
package cluster
