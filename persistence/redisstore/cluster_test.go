package redisstore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/persistencetest"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// TestClusterConformance runs the store suite against a real Redis Cluster
// of three masters, through a go-redis cluster client. Each test gets its
// own prefix; Reopen closes the store and opens a new one on the same
// client and prefix (the cluster keeps running: a crash of Redis itself is
// TestConformance's part).
func TestClusterConformance(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	rc := cl.Client(t)
	var n atomic.Int64
	var mu sync.Mutex
	prefixes := map[persistence.Store]string{}
	open := func(t *testing.T, prefix string) persistence.Store {
		s, err := redisstore.New(rc, redisstore.Options{Prefix: prefix, ReadPageSize: 7})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		prefixes[s] = prefix
		mu.Unlock()
		return s
	}
	persistencetest.Run(t, persistencetest.Harness{
		New: func(t *testing.T) persistence.Store {
			return open(t, fmt.Sprintf("cluster-%d", n.Add(1)))
		},
		Reopen: func(t *testing.T, s persistence.Store) persistence.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			p := prefixes[s]
			mu.Unlock()
			return open(t, p)
		},
		// Checkpoint appends outputs before its fenced script.
		OutputsAtLeastOnce: true,
	})
}

// TestClusterSpread checks that key groups really are spread over the
// masters, and that each group's keys (meta, log and snapshots) share one
// slot and so one master.
func TestClusterSpread(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	rc := cl.Client(t)
	ctx := t.Context()
	const prefix, groups = "spread", 64
	s, err := redisstore.New(rc, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CheckGroups(ctx, groups, 2); err != nil {
		t.Fatal(err)
	}
	epochs := make([]persistence.Epoch, groups)
	var entries []persistence.Entry
	for g := range uint32(groups) {
		st, err := s.Claim(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		epochs[g] = st.Epoch
		entries = append(entries, persistence.Entry{Group: g, Epoch: st.Epoch, Data: fmt.Appendf(nil, "g%d", g)})
	}
	// One Append over every group: one pipeline per master.
	pos, err := s.Append(ctx, entries)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pos {
		if p != 1 {
			t.Fatalf("Append: group %d got position %d, want 1", entries[i].Group, p)
		}
	}
	const g = 5
	if _, err := s.Append(ctx, []persistence.Entry{{Group: g, Epoch: epochs[g], Data: []byte("two")}}); err != nil {
		t.Fatal(err)
	}
	snaps := []persistence.Snapshot{{Key: "a", Data: []byte("A")}, {Key: "b\x00", Data: []byte("B")}}
	if err := s.Checkpoint(ctx, g, epochs[g], persistence.CheckpointData{Snapshots: snaps, Through: 1}); err != nil {
		t.Fatal(err)
	}

	// The keys each master holds.
	var mu sync.Mutex
	byMaster := map[string][]string{}
	err = rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			return err
		}
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if n != int64(len(keys)) {
			return fmt.Errorf("%s: DBSIZE %d but KEYS * lists %d keys", c.Options().Addr, n, len(keys))
		}
		mu.Lock()
		byMaster[c.Options().Addr] = keys
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(byMaster) != 3 {
		t.Fatalf("ForEachMaster visited %d masters, want 3", len(byMaster))
	}
	withGroups := 0
	all := map[string]string{} // key -> master
	for _, addr := range slices.Sorted(maps.Keys(byMaster)) {
		keys := byMaster[addr]
		metas := 0
		for _, k := range keys {
			if prev, dup := all[k]; dup {
				t.Errorf("key %q on both %s and %s", k, prev, addr)
			}
			all[k] = addr
			if strings.HasSuffix(k, "}:m") {
				metas++
			}
		}
		if metas > 0 {
			withGroups++
		}
		t.Logf("master %s: %d keys, %d groups", addr, len(keys), metas)
	}
	if withGroups < 2 {
		t.Errorf("the groups' keys are on %d master(s), want them spread over at least 2", withGroups)
	}
	// Every group's meta and log, the store's meta and group 5's two
	// snapshots; nothing else.
	if want := 2*groups + 1 + 2; len(all) != want {
		t.Errorf("the cluster holds %d keys, want %d", len(all), want)
	}

	// Group 5's keys share one slot, held by one master, which has them all.
	tag := fmt.Sprintf("{%s:%d}", prefix, g)
	groupKeys := []string{tag + ":m", tag + ":log:1", tag + ":s:a", tag + ":s:b\x00"}
	slot, err := rc.ClusterKeySlot(ctx, groupKeys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	master := all[groupKeys[0]]
	if master == "" {
		t.Fatalf("no master holds %q", groupKeys[0])
	}
	for _, k := range groupKeys {
		if got, err := rc.ClusterKeySlot(ctx, k).Result(); err != nil || got != slot {
			t.Errorf("CLUSTER KEYSLOT %q = %d, %v; want %d, the slot of %q", k, got, err, slot, groupKeys[0])
		}
		if all[k] != master {
			t.Errorf("key %q is on master %q, want %s with the rest of group %d", k, all[k], master, g)
		}
	}
	err = rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if c.Options().Addr != master {
			return nil
		}
		n, err := c.ClusterCountKeysInSlot(ctx, int(slot)).Result()
		if err != nil {
			return err
		}
		if n != int64(len(groupKeys)) {
			return fmt.Errorf("%s: CLUSTER COUNTKEYSINSLOT %d = %d, want the %d keys of group %d", master, slot, n, len(groupKeys), g)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}

	// And the store reads back what it wrote, from every master.
	for gr := range uint32(groups) {
		var got []string
		err := s.Read(ctx, gr, 0, func(p persistence.Position, d []byte) error {
			got = append(got, fmt.Sprintf("%d:%s", p, d))
			return nil
		})
		want := []string{fmt.Sprintf("1:g%d", gr)}
		if gr == g {
			want = []string{"2:two"} // 1 is checkpointed
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Read(%d) = %q, %v; want %q", gr, got, err, want)
		}
	}
	for _, sn := range snaps {
		if got, err := s.Get(ctx, g, sn.Key); err != nil || string(got) != string(sn.Data) {
			t.Errorf("Get(%d, %q) = %q, %v; want %q", g, sn.Key, got, err, sn.Data)
		}
	}
}

// TestClusterScriptCacheFlushed: each master caches scripts on its own, so
// a master may lack a script the others have (a restarted or new master, a
// SCRIPT FLUSH). The store still works, including its Append pipelined over
// several masters where some answer NOSCRIPT and some do not.
func TestClusterScriptCacheFlushed(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	rc := cl.Client(t)
	ctx := t.Context()
	s, err := redisstore.New(rc, redisstore.Options{Prefix: "flush"})
	if err != nil {
		t.Fatal(err)
	}
	const groups = 16
	flush := func(all bool) {
		t.Helper()
		i := 0
		var mu sync.Mutex
		err := rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			i++
			skip := !all && i == 1 // leave one master's cache alone
			mu.Unlock()
			if skip {
				return nil
			}
			return c.ScriptFlush(ctx).Err()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	last := make([]persistence.Position, groups)
	for round := range 4 {
		flush(round%2 == 0)
		epochs := make([]persistence.Epoch, groups)
		for g := range uint32(groups) {
			st, err := s.Claim(ctx, g)
			if err != nil {
				t.Fatalf("round %d: Claim(%d): %v", round, g, err)
			}
			epochs[g] = st.Epoch
		}
		flush(round%2 == 1)
		var entries []persistence.Entry
		for g := range uint32(groups) {
			entries = append(entries, persistence.Entry{Group: g, Epoch: epochs[g], Data: []byte("x")})
		}
		pos, err := s.Append(ctx, entries)
		if err != nil {
			t.Fatalf("round %d: Append: %v", round, err)
		}
		for g, p := range pos {
			if p != last[g]+1 {
				t.Fatalf("round %d: group %d got position %d, want %d", round, g, p, last[g]+1)
			}
			last[g] = p
		}
		flush(true)
		for g := range uint32(groups) {
			if err := s.Checkpoint(ctx, g, epochs[g], persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("v")}}, Through: last[g]}); err != nil {
				t.Fatalf("round %d: Checkpoint(%d): %v", round, g, err)
			}
		}
	}
	// The test did exercise the fallback: every master answered NOSCRIPT.
	err = rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "errorstats").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "errorstat_NOSCRIPT:") {
			return fmt.Errorf("%s never answered NOSCRIPT: %q", c.Options().Addr, info)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// TestClusterCheckpointDuringMigration: while a group's slot migrates (all
// its keys moved to the importing master, the slot not yet handed over), a
// checkpoint either writes what it was given or fails; it never reports
// success without writing, as a format 3 checkpoint did when go-redis's
// cluster Watch ran out of redirections and returned nil without running
// the transaction. After the migration the next checkpoint writes.
func TestClusterCheckpointDuringMigration(t *testing.T) {
	cl := redistest.StartCluster(t, 2)
	rc := cl.Client(t)
	ctx := t.Context()
	nodes := map[string]*redis.Client{}
	ids := map[string]string{}
	for _, a := range cl.Addrs() {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { c.Close() })
		nodes[a] = c
		ids[a] = c.ClusterMyID(ctx).Val()
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, format := range []string{"3", "2"} {
		prefix := "mig" + format
		must(rc.HSet(ctx, prefix+":meta", "format", format).Err())
		s, err := redisstore.New(rc, redisstore.Options{Prefix: prefix})
		must(err)
		st, err := s.Claim(ctx, 1)
		must(err)
		_, err = s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("r")}})
		must(err)
		cp := persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("v1")}}, Through: 1}
		must(s.Checkpoint(ctx, 1, st.Epoch, cp))

		tag := "{" + prefix + ":1}"
		slot := int(rc.ClusterKeySlot(ctx, tag+":m").Val())
		var src, dst string
		for a, c := range nodes {
			if c.ClusterCountKeysInSlot(ctx, slot).Val() > 0 {
				src = a
			} else {
				dst = a
			}
		}
		must(nodes[dst].Do(ctx, "cluster", "setslot", slot, "importing", ids[src]).Err())
		must(nodes[src].Do(ctx, "cluster", "setslot", slot, "migrating", ids[dst]).Err())
		host, port, _ := strings.Cut(dst, ":")
		for _, k := range nodes[src].ClusterGetKeysInSlot(ctx, slot, 100).Val() {
			must(nodes[src].Migrate(ctx, host, port, k, 0, 5e9).Err())
		}
		cp.Snapshots[0].Data = []byte("v2")
		err = s.Checkpoint(ctx, 1, st.Epoch, cp)
		if got := rc.Get(ctx, tag+":s:k").Val(); err == nil && got != "v2" {
			t.Errorf("format %s: Checkpoint during the migration returned nil, and the snapshot is %q, not v2", format, got)
		}
		t.Logf("format %s: Checkpoint during the migration: %v", format, err)

		for _, c := range nodes {
			must(c.Do(ctx, "cluster", "setslot", slot, "node", ids[dst]).Err())
		}
		cp.Snapshots[0].Data = []byte("v3")
		if err := s.Checkpoint(ctx, 1, st.Epoch, cp); err != nil {
			t.Errorf("format %s: Checkpoint after the migration: %v", format, err)
		}
		if got := rc.Get(ctx, tag+":s:k").Val(); got != "v3" {
			t.Errorf("format %s: snapshot after the migration %q, want v3", format, got)
		}
	}
}
