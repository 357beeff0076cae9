package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Membership: each node registers itself under a lease and renews it; a node
// whose lease ran out (killed, partitioned) is gone. Members are named by
// their advertised address (host:port), which is unique among live nodes.

// Members lists the live members.
type Members interface {
	// Members returns the ids of the live members, sorted.
	Members(ctx context.Context) ([]string, error)
}

// Static is a fixed member list (a static seed list: every node is
// configured with all of them).
type Static []string

// Members implements Members.
func (s Static) Members(context.Context) ([]string, error) {
	ms := slices.Clone([]string(s))
	slices.Sort(ms)
	return slices.Compact(ms), nil
}

// Registry keeps members' leases in Redis, as Orleans' Redis clustering
// does: a sorted set of member ids scored by lease expiry, under one hash
// tag so that a Redis Cluster keeps it in one slot. Expiry uses the Redis
// server's clock (TIME), so nodes' clocks need not agree.
type Registry struct {
	c     redis.UniversalClient
	key   string
	lease time.Duration
}

// DefaultLease is how long a member stays listed without renewing: the
// failure detection time. Renew well within it (a third).
const DefaultLease = 3 * time.Second

// NewRegistry returns a registry in c under prefix (the store's prefix:
// one cluster per deployment), with the given lease (0: DefaultLease).
func NewRegistry(c redis.UniversalClient, prefix string, lease time.Duration) *Registry {
	if lease <= 0 {
		lease = DefaultLease
	}
	if prefix == "" {
		prefix = "keyfold"
	}
	return &Registry{c: c, key: "{" + prefix + "}:members", lease: lease}
}

// renewScript renews (or takes) member ARGV[1]'s lease for ARGV[2] ms, drops
// the expired leases, and returns the live members with their expiries.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
`)

// Renew takes or renews id's lease and returns the live members, sorted.
func (r *Registry) Renew(ctx context.Context, id string) ([]string, error) {
	if id == "" || strings.ContainsAny(id, " \t\r\n") {
		return nil, fmt.Errorf("cluster: member id %q must be non-empty, without spaces", id)
	}
	return r.run(ctx, id)
}

// Members implements Members: the members whose lease has not run out.
func (r *Registry) Members(ctx context.Context) ([]string, error) { return r.run(ctx, "") }

func (r *Registry) run(ctx context.Context, id string) ([]string, error) {
	ms, err := renewScript.Run(ctx, r.c, []string{r.key}, id, r.lease.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("cluster: renew lease: %w", err)
	}
	slices.Sort(ms)
	return ms, nil
}

// Leave drops id's lease at once (a graceful leave), so the others need not
// wait for it to run out.
func (r *Registry) Leave(ctx context.Context, id string) error {
	if err := r.c.ZRem(ctx, r.key, id).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	return nil
}

// Lease returns the registry's lease.
func (r *Registry) Lease() time.Duration { return r.lease }
