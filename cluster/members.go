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
// the expired leases, and returns whether ARGV[1]'s lease was still live
// ("1") or had to be taken anew ("0"), then the live members.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = '0'
if ARGV[1] ~= '' then
  local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if s and tonumber(s) > now then
    held = '1'
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
local out = redis.call('ZRANGE', KEYS[1], 0, -1)
table.insert(out, 1, held)
return out
`)

// Renew takes or renews id's lease and returns the live members, sorted.
func (r *Registry) Renew(ctx context.Context, id string) ([]string, error) {
	ms, _, err := r.Extend(ctx, id)
	return ms, err
}

// Extend is Renew that also reports whether id's lease was still live when
// the server renewed it. False means it had run out (or never existed): the
// other members may have seen id leave and taken its work over, and id must
// act as a member that just joined. Whether a lease is live is decided by
// the server's clock, as it is for every member.
func (r *Registry) Extend(ctx context.Context, id string) (members []string, held bool, err error) {
	if id == "" || strings.ContainsAny(id, " \t\r\n") {
		return nil, false, fmt.Errorf("cluster: member id %q must be non-empty, without spaces", id)
	}
	return r.run(ctx, id)
}

// Members implements Members: the members whose lease has not run out.
func (r *Registry) Members(ctx context.Context) ([]string, error) {
	ms, _, err := r.run(ctx, "")
	return ms, err
}

func (r *Registry) run(ctx context.Context, id string) ([]string, bool, error) {
	out, err := renewScript.Run(ctx, r.c, []string{r.key}, id, r.lease.Milliseconds()).StringSlice()
	if err != nil {
		return nil, false, fmt.Errorf("cluster: renew lease: %w", err)
	}
	if len(out) == 0 {
		return nil, false, fmt.Errorf("cluster: renew lease: %w", errShortReply)
	}
	ms := out[1:]
	slices.Sort(ms)
	return ms, out[0] == "1", nil
}

// Leave drops id's lease at once (a graceful leave), so the others need not
// wait for it to run out.
func (r *Registry) Leave(ctx context.Context, id string) error {
	if err := r.c.ZRem(ctx, r.key, id).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	return nil
}

// errShortReply is a lease script reply without the lease's state.
var errShortReply = errors.New("cluster: empty reply from the lease script")

// Lease returns the registry's lease.
func (r *Registry) Lease() time.Duration { return r.lease }
