package redistest

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// clusterReadyTimeout bounds the wait for a new cluster to agree on its
// slots. A master only turns its state to ok about 2 s after it starts
// (Redis's CLUSTER_WRITABLE_DELAY), so this leaves ample room.
const clusterReadyTimeout = 20 * time.Second

// Cluster is a Redis Cluster of masters without replicas, each a
// redis-server process started by the test, on loopback ports, with the
// append-only file synced on every write. It is formed with go-redis alone
// (CLUSTER ADDSLOTSRANGE and CLUSTER MEET), without redis-cli.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts a Redis Cluster of the given number of masters (at
// least 1; 3 is the usual minimum of a real deployment), each owning an
// even share of the 16384 slots, and waits until every node reports
// cluster_state:ok and sees every slot served by the expected masters. The
// processes are killed when the test ends.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 || masters > clusterSlots {
		t.Fatalf("redistest: StartCluster(%d): need between 1 and %d masters", masters, clusterSlots)
	}
	bin := redisServer(t)
	c := &Cluster{}
	for i := range masters {
		// The bus port is given explicitly: the default, port+10000, may
		// be above 65535.
		n, err := startServer(t, bin, func(dir string) []string {
			return []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-node-timeout", "5000",
				"--cluster-port", strconv.Itoa(freePort(t)),
			}
		})
		if err != nil {
			t.Fatalf("redistest: start cluster node %d: %v", i, err)
		}
		c.nodes = append(c.nodes, n)
	}
	start := time.Now()
	if err := c.form(); err != nil {
		t.Fatalf("redistest: form cluster: %v%s", err, c.logs())
	}
	t.Logf("redistest: cluster of %d masters %v ready in %v", masters, c.Addrs(), time.Since(start).Round(time.Millisecond))
	return c
}

// form assigns each node its range of slots, introduces the nodes to each
// other and waits for every node to see the whole, healthy cluster.
func (c *Cluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
		defer clients[i].Close()
	}
	for i, rc := range clients {
		// Distinct config epochs up front, as redis-cli does, so the nodes
		// need not resolve epoch collisions before agreeing.
		if err := rc.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %w", c.nodes[i].Addr(), err)
		}
		lo := i * clusterSlots / len(c.nodes)
		hi := (i+1)*clusterSlots/len(c.nodes) - 1
		if err := rc.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %w", c.nodes[i].Addr(), lo, hi, err)
		}
	}
	// Every pair meets directly: learning of a third node by gossip alone
	// takes seconds (a ping carries few other nodes).
	for i, rc := range clients {
		for _, n := range c.nodes[i+1:] {
			if err := rc.Do(ctx, "cluster", "meet", "127.0.0.1", n.port, n.busPort()).Err(); err != nil {
				return fmt.Errorf("%s: CLUSTER MEET %s (bus port %d): %w", c.nodes[i].Addr(), n.Addr(), n.busPort(), err)
			}
		}
	}
	for {
		err := c.ready(ctx, clients)
		if err == nil {
			return nil
		}
		for _, n := range c.nodes {
			if n.exited() {
				return fmt.Errorf("redis-server on %s exited", n.Addr())
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v: %w", clusterReadyTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ready checks that every node reports cluster_state:ok with all slots
// assigned and ok, knows every node, and maps every slot to one of the
// expected masters, each master serving its share.
func (c *Cluster) ready(ctx context.Context, clients []*redis.Client) error {
	want := map[string]bool{}
	for _, n := range c.nodes {
		want[n.Addr()] = true
	}
	for i, rc := range clients {
		addr := c.nodes[i].Addr()
		info, err := rc.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
		}
		fields := map[string]string{}
		for line := range strings.Lines(info) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			fields[k] = v
		}
		for k, v := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": strconv.Itoa(clusterSlots),
			"cluster_slots_ok":       strconv.Itoa(clusterSlots),
			"cluster_known_nodes":    strconv.Itoa(len(c.nodes)),
			"cluster_size":           strconv.Itoa(len(c.nodes)),
		} {
			if fields[k] != v {
				return fmt.Errorf("%s: CLUSTER INFO has %s:%s, want %s", addr, k, fields[k], v)
			}
		}
		//lint:ignore SA1019 CLUSTER SLOTS still answers on Redis 7 and its ranges are what this check compares
		slots, err := rc.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SLOTS: %w", addr, err)
		}
		total := 0
		seen := map[string]bool{}
		for _, s := range slots {
			if len(s.Nodes) == 0 || !want[s.Nodes[0].Addr] {
				return fmt.Errorf("%s: CLUSTER SLOTS maps slots %d-%d to %v, not one of the cluster's masters", addr, s.Start, s.End, s.Nodes)
			}
			seen[s.Nodes[0].Addr] = true
			total += s.End - s.Start + 1
		}
		if total != clusterSlots || len(seen) != len(c.nodes) {
			return fmt.Errorf("%s: CLUSTER SLOTS covers %d slots on %d masters, want %d on %d", addr, total, len(seen), clusterSlots, len(c.nodes))
		}
	}
	return nil
}

// logs returns the tail of every node's log, for an error message.
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "\n--- %s (%s) log:\n%s", n.Addr(), n.dir, n.logTail())
	}
	return b.String()
}

// Addrs returns the host:port of every master.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a new cluster client seeded with every master, closed when
// t ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}
