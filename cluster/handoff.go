package cluster

import (
	"context"
	"slices"
	"time"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// The notices between members: best effort, each only hastening what the
// members' renewals would bring about a renew period later anyway.

// releaseNote is a previous owner's word that it released a group.
type releaseNote struct {
	from string
	at   time.Time
}

// notifyTimeout bounds the best-effort notices between members.
const notifyTimeout = time.Second

// MembersChanged is member from's word (the Cluster service's
// MembersChanged) that the member list changed, and whether it is leaving:
// the renew loop reads the list now.
func (c *Node) MembersChanged(from string, leaving bool) {
	if leaving {
		c.leaving.Store(from, time.Now())
	}
	c.askRefresh()
}

// Released is member from's word (the Cluster service's Released) that it
// released groups, which placement now gives this node: the placement loop
// takes them over without waiting out the renew period.
func (c *Node) Released(from string, groups []uint32) {
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

// tellMembersChanged asks the other members to read the member list now.
// Best effort: they read it at their next renewal anyway.
func (c *Node) tellMembersChanged(members []string, leaving bool) {
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
func (c *Node) tellReleased(v *view, owned, mine []uint32) {
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

func (c *Node) notify(member string, call func(context.Context, keyfoldv1.ClusterClient) error) {
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

// takeReleased returns (and forgets) the groups of want whose owner in
// prev has said it released them. A note older than the lease is
// dropped: it belongs to an earlier hand-off.
func (c *Node) takeReleased(prev Assignment, want []uint32) []uint32 {
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

// forgetReleased drops the notes of groups taken over without one.
func (c *Node) forgetReleased(groups []uint32) {
	c.releasedMu.Lock()
	for _, g := range groups {
		delete(c.released, g)
	}
	c.releasedMu.Unlock()
}

// unannounced returns the departed members that did not say they were
// leaving (within two leases).
func (c *Node) unannounced(left []string) []string {
	var failed []string
	for _, m := range left {
		at, ok := c.leaving.LoadAndDelete(m)
		if !ok || time.Since(at.(time.Time)) > 2*c.lease {
			failed = append(failed, m)
		}
	}
	return failed
}
