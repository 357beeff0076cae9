package keyfold_test

// Several cluster nodes in one process, each with its own protoactor-go
// actor system. They run under -race too (make test): protoactor-go raised
// no race between systems here, and the race detector found one of ours in
// the placement loop. cmd/keyfold's cluster test runs real processes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/servicetest"
)

func clusterConfig(t *testing.T, redisURL string) keyfold.Config {
	t.Helper()
	cfg := servicetest.Config(t, `
pipelines:
  p:
    key: k
    id: id
    aggregates:
      n: { op: count }
      sum: { op: sum, field: v }
      last: { op: last, field: v }
`)
	cfg.Redis, cfg.Cluster, cfg.ClusterLease = redisURL, "t", 600*time.Millisecond
	cfg.GRPCAddr = "127.0.0.1:0"
	return cfg
}

func ev(key, id string, v int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"k":%q,"id":%q,"v":%d}`, key, id, v))
}

// waitStable waits until n sees want members, all serving their share.
func waitStable(t testing.TB, n *keyfold.Node, want int) keyfold.ClusterInfo {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := n.Cluster(context.Background(), "", "")
		stable := err == nil && len(info.Members) == want
		total := uint32(0)
		for _, m := range info.Members {
			stable = stable && m.State == "serving" && int(m.GroupsServing) == m.GroupsAssigned && int(m.GroupsOwned) == m.GroupsAssigned
			total += m.GroupsServing
		}
		if stable && total == info.KeyGroups {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not stable with %d members: %+v, %v", want, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterRouting: three nodes on one Redis. Every node accepts every
// call: a batch spanning owners is split and forwarded, queries and
// deletions go to the owner, batches submitted in a row reach a remote
// owner in order, an invalid batch changes nothing anywhere, and a node's
// graceful leave moves its groups without losing or doubling anything.
func TestClusterRouting(t *testing.T) {
	srv := redistest.Start(t)
	a := servicetest.Run(t, clusterConfig(t, srv.URL()))
	b, berr := servicetest.Start(t, clusterConfig(t, srv.URL()))
	c := servicetest.Run(t, clusterConfig(t, srv.URL()))
	info := waitStable(t, a, 3)
	for _, m := range info.Members {
		if m.GroupsAssigned < 3 {
			t.Errorf("member %s has %d of %d groups", m.ID, m.GroupsAssigned, info.KeyGroups)
		}
	}
	ctx := context.Background()

	// One batch over many keys, through a: every share lands once.
	var batch []json.RawMessage
	for i := range 200 {
		batch = append(batch, ev(fmt.Sprintf("k%d", i%50), fmt.Sprintf("a%d", i), i))
	}
	res, err := a.Ingest(ctx, "p", batch)
	if err != nil || res.Accepted != 200 {
		t.Fatalf("ingest through a: %+v, %v", res, err)
	}
	// a applied exactly the events of the keys it owns.
	mine := 0
	for i := range 200 {
		info, err := a.Cluster(ctx, "p", fmt.Sprintf("k%d", i%50))
		if err != nil {
			t.Fatal(err)
		}
		if info.Key.Owner == a.GRPCAddr() {
			mine++
		}
	}
	if got := a.Stats().Events; got != int64(mine) {
		t.Errorf("a applied %d events, want the %d of the keys it owns (the others' forwarded)", got, mine)
	}
	// Sent again through c: all duplicates (the owners remember the ids).
	if res, err := c.Ingest(ctx, "p", batch); err != nil || res.Duplicates != 200 {
		t.Fatalf("resend through c: %+v, %v", res, err)
	}
	want := func(key string) (n, sum int) {
		for i := range 200 {
			if fmt.Sprintf("k%d", i%50) == key {
				n, sum = n+1, sum+i
			}
		}
		return n, sum
	}
	// Every node answers, with the same value types wherever the key lives.
	for _, node := range []*keyfold.Node{a, b, c} {
		for i := range 50 {
			key := fmt.Sprintf("k%d", i)
			st, err := node.Query(ctx, "p", key)
			n, sum := want(key)
			if err != nil || st.Seq != uint64(n) || st.Aggregates["sum"] != float64(sum) || st.Aggregates["n"] != uint64(n) {
				t.Fatalf("%s through %s: %+v, %v; want n=%d sum=%d", key, node.GRPCAddr(), st, err, n, sum)
			}
			if _, ok := st.Aggregates["last"].(json.RawMessage); !ok {
				t.Fatalf("%s through %s: last is a %T, want json.RawMessage", key, node.GRPCAddr(), st.Aggregates["last"])
			}
		}
	}

	// A key a does not own: batches submitted in a row apply in order.
	remote := ""
	for i := 0; remote == ""; i++ {
		k := fmt.Sprintf("r%d", i)
		if info, _ := a.Cluster(ctx, "p", k); info.Key.Owner != a.GRPCAddr() {
			remote = k
		}
	}
	var pending []keyfold.PendingIngest
	for i := range 100 {
		p, err := a.SubmitIngest(ctx, "p", [][]byte{ev(remote, fmt.Sprintf("o%d", i), i)})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, p)
	}
	for _, p := range pending {
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := c.Query(ctx, "p", remote); err != nil || string(st.Aggregates["last"].(json.RawMessage)) != "99" || st.Seq != 100 {
		t.Fatalf("%s after 100 ordered batches: %+v, %v; want last 99", remote, st, err)
	}

	// An invalid event rejects the whole batch before any share leaves.
	_, err = b.Ingest(ctx, "p", []json.RawMessage{ev("fresh1", "x1", 1), ev("fresh2", "x2", 1), json.RawMessage(`{"v":1}`)})
	var be *keyfold.BatchError
	if !errors.As(err, &be) || be.Index != 2 {
		t.Fatalf("invalid batch: %v, want a BatchError at index 2", err)
	}
	for _, k := range []string{"fresh1", "fresh2"} {
		if _, err := c.Query(ctx, "p", k); !errors.Is(err, keyfold.ErrNotFound) {
			t.Fatalf("%s after a rejected batch: %v, want ErrNotFound", k, err)
		}
	}

	// Deletion through a node that does not own the key.
	if err := a.Delete(ctx, "p", remote); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Query(ctx, "p", remote); !errors.Is(err, keyfold.ErrNotFound) {
		t.Fatalf("deleted %s: %v, want ErrNotFound", remote, err)
	}

	// b leaves gracefully; writes keep coming through a and c meanwhile.
	stop := make(chan struct{})
	sent := make(chan int)
	var acked atomic.Int64
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				sent <- n
				return
			default:
			}
			key := fmt.Sprintf("k%d", n%50)
			node := []*keyfold.Node{a, c}[n%2]
			for {
				_, err := node.Ingest(ctx, "p", []json.RawMessage{ev(key, fmt.Sprintf("m%d", n), 1)})
				if err == nil {
					break
				}
				if !errors.Is(err, keyfold.ErrUnavailable) {
					t.Errorf("ingest during the leave: %v", err)
					sent <- n
					return
				}
			}
			n++
			acked.Store(int64(n))
		}
	}()
	// waitWrites waits until n more writes were acknowledged.
	waitWrites := func(n int64) {
		t.Helper()
		want, deadline := acked.Load()+n, time.Now().Add(20*time.Second)
		for acked.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d writes acknowledged, want %d", acked.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitWrites(20)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-berr; err != nil {
		t.Fatalf("b's Run: %v", err)
	}
	waitStable(t, a, 2)
	waitWrites(20)
	close(stop)
	moved := <-sent
	if moved == 0 {
		t.Fatal("no write went through during the leave")
	}
	for i := range 50 {
		key := fmt.Sprintf("k%d", i)
		n, sum := want(key)
		extra := 0
		for j := range moved {
			if j%50 == i {
				extra++
			}
		}
		st, err := c.Query(ctx, "p", key)
		if err != nil || st.Seq != uint64(n+extra) || st.Aggregates["sum"] != float64(sum+extra) {
			t.Fatalf("%s after b left: %+v, %v; want n=%d", key, st, err, n+extra)
		}
	}
}

// freeAddr returns a loopback address with a port free a moment ago (the
// static member list needs the addresses before the nodes start). The port
// is drawn below the kernel's ephemeral range: a port the kernel handed out
// for :0 and took back is the next one it hands to another test's listener
// or outgoing connection, and a node then failed to bind it ("address
// already in use", seen in CI). Below the range only another test drawing
// at random can take it. (Falls back to :0 if the range starts too low.)
func freeAddr(t *testing.T) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const first = 10000
	for range 100 {
		if low-first < 1000 {
			break
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(first+rand.IntN(low-first)))
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestClusterStaticPeers: members from a static list instead of leases:
// the nodes split the groups and route to each other.
func TestClusterStaticPeers(t *testing.T) {
	srv := redistest.Start(t)
	addrs := []string{freeAddr(t), freeAddr(t)}
	var nodes []*keyfold.Node
	for _, addr := range addrs {
		cfg := clusterConfig(t, srv.URL())
		cfg.GRPCAddr, cfg.Peers, cfg.ClusterLease = addr, addrs, 0
		cfg.MaxBodyBytes = 16 << 10 // the members' message limit too
		nodes = append(nodes, servicetest.Run(t, cfg))
	}
	info := waitStable(t, nodes[1], 2)
	if info.Membership != "static" || info.FailureDetection != "" {
		t.Errorf("membership %q, failure detection %q; want static, none", info.Membership, info.FailureDetection)
	}
	// 2,000 events (≈ 60 KiB): more than one message to the other member
	// can carry; the share is split.
	var batch []json.RawMessage
	for i := range 2000 {
		batch = append(batch, ev(fmt.Sprintf("s%d", i%40), fmt.Sprintf("s%d", i), i))
	}
	if res, err := nodes[0].Ingest(context.Background(), "p", batch); err != nil || res.Accepted != 2000 {
		t.Fatalf("ingest: %+v, %v", res, err)
	}
	for i := range 40 {
		if st, err := nodes[1].Query(context.Background(), "p", fmt.Sprintf("s%d", i)); err != nil || st.Seq != 50 {
			t.Fatalf("s%d: %+v, %v", i, st, err)
		}
	}
	if nodes[0].Stats().Events == 2000 || nodes[1].Stats().Events == 2000 {
		t.Errorf("one node applied every event: %d, %d", nodes[0].Stats().Events, nodes[1].Stats().Events)
	}
}

// TestClusterReadyOnceJoined: a member is not ready (readyz, Serving)
// until it serves its share, though it already routes calls.
func TestClusterReadyOnceJoined(t *testing.T) {
	srv := redistest.Start(t)
	// The other member of the static list never starts: this node takes
	// over its own share only after the hand-off delay (the other might
	// still be releasing it).
	self, other := freeAddr(t), freeAddr(t)
	cfg := clusterConfig(t, srv.URL())
	cfg.GRPCAddr, cfg.Peers, cfg.ClusterLease = self, []string{self, other}, 0
	n, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- n.Run(context.Background()) }()
	t.Cleanup(func() {
		n.Close()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := n.Cluster(context.Background(), "", "")
		if err == nil {
			if info.Membership != "static" || len(info.Members) != 2 || info.Members[0].State == "serving" || info.Members[1].State == "serving" {
				t.Fatalf("the cluster as soon as the member list is known: %+v", info)
			}
			break
		}
		if !errors.Is(err, keyfold.ErrNotReady) || time.Now().After(deadline) {
			t.Fatalf("Cluster: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n.Serving() {
		t.Fatal("Serving before the node serves its share")
	}
	select {
	case <-n.Ready():
		t.Fatal("Ready before the node serves its share")
	default:
	}
	<-n.Ready()
	if !n.Serving() {
		t.Fatal("not Serving once ready")
	}
}

// TestClusterHandoffNotices: with a lease so long that renewals are 10 s
// apart, a joining node still gets its share at once: it asks the others
// to read the member list now, they release its groups and say so, and it
// takes each over on that word instead of waiting a renew period. A
// graceful leave is seen at once too.
func TestClusterHandoffNotices(t *testing.T) {
	srv := redistest.Start(t)
	long := func() keyfold.Config {
		cfg := clusterConfig(t, srv.URL())
		cfg.ClusterLease = 30 * time.Second
		return cfg
	}
	a := servicetest.Run(t, long())
	start := time.Now()
	b, berr := servicetest.Start(t, long())
	if took := time.Since(start); took > 8*time.Second {
		t.Fatalf("the second node served its share after %v: it waited for renewals (10 s apart)", took)
	}
	waitStable(t, a, 2)
	start = time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-berr; err != nil {
		t.Fatal(err)
	}
	waitStable(t, a, 1)
	if took := time.Since(start); took > 8*time.Second {
		t.Fatalf("the leave was seen after %v: the others waited for their renewal", took)
	}
}

// TestClusterReadsNeedAConfirmedLease: a member answers queries from
// memory only while Redis confirms its lease. With Redis stopped, its
// queries are refused (routed again until the call ends) once its last
// renewal was sent more than a renew interval and a margin ago, long
// before the lease could run out and another member take its groups over,
// although nothing else changed; once Redis answers again they are served.
func TestClusterReadsNeedAConfirmedLease(t *testing.T) {
	srv := redistest.Start(t)
	cfg := clusterConfig(t, srv.URL())
	cfg.ClusterLease = 3 * time.Second // renewals a second apart
	n := servicetest.Run(t, cfg)
	waitStable(t, n, 1)
	ctx := context.Background()
	if _, err := n.Ingest(ctx, "p", []json.RawMessage{ev("k1", "e1", 5)}); err != nil {
		t.Fatal(err)
	}
	query := func() (keyfold.KeyState, error) {
		qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		return n.Query(qctx, "p", "k1")
	}
	if st, err := query(); err != nil || st.Seq != 1 {
		t.Fatalf("query: %+v %v", st, err)
	}
	srv.Pause()
	paused := time.Now()
	for {
		_, err := query()
		if err != nil {
			if !errors.Is(err, keyfold.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("query with Redis stopped: %v, want ErrUnavailable (or the deadline, while it is routed again)", err)
			}
			t.Logf("figure: queries refused %v after Redis stopped (lease %v)", time.Since(paused).Round(time.Millisecond), cfg.ClusterLease)
			break
		}
		if time.Since(paused) > cfg.ClusterLease {
			t.Fatalf("queries still answered from memory %v after Redis stopped, beyond the lease (%v): other members may own the group by now",
				time.Since(paused).Round(time.Millisecond), cfg.ClusterLease)
		}
		time.Sleep(10 * time.Millisecond) // between polls
	}
	srv.Resume()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := query()
		if err == nil {
			if st.Seq != 1 {
				t.Fatalf("after Redis resumed: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queries still refused 20s after Redis resumed: %v", err)
		}
	}
}

// TestClusterForwardTakesOnlyMembersAtTheirWord: an owner applies a
// forwarded share as its sender read it (what the sender says of each
// event, not parsed again) only from a current member whose pipeline is
// the owner's; anyone else's share is validated as a public ingest. The
// shares here say their events hold v=1000 where they hold v=1.
func TestClusterForwardTakesOnlyMembersAtTheirWord(t *testing.T) {
	srv := redistest.Start(t)
	cfg := clusterConfig(t, srv.URL())
	a := servicetest.Run(t, cfg)
	b := servicetest.Run(t, clusterConfig(t, srv.URL()))
	waitStable(t, a, 2)
	ctx := context.Background()
	key := ""
	for i := 0; key == ""; i++ {
		if info, err := a.Cluster(ctx, "p", fmt.Sprintf("t%d", i)); err == nil && info.Key.Owner == a.GRPCAddr() {
			key = info.Key.Key
		}
	}
	p, err := fold.Compile("p", cfg.Pipelines["p"])
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := keyfoldv1.NewClusterClient(conn)
	// forward sends a's Cluster service one event holding v=1, with the
	// prepared fields of one holding v=1000 (or prepared as given).
	forward := func(from, id string, fingerprint uint64, raw []byte, prepared []byte) *keyfoldv1.ForwardResult {
		t.Helper()
		if raw == nil {
			raw = ev(key, id, 1)
			lie, err := p.Prepare(ev(key, id, 1000))
			if err != nil {
				t.Fatal(err)
			}
			prepared = p.AppendPrepared(nil, lie)
		}
		resp, err := cl.Forward(ctx, &keyfoldv1.ForwardRequest{From: from, Batches: []*keyfoldv1.ForwardBatch{{
			Pipeline: "p", PipelineFingerprint: fingerprint, Events: [][]byte{raw}, Keys: []string{key}, Prepared: prepared}}})
		if err != nil || len(resp.Results) != 1 {
			t.Fatalf("Forward from %s: %v, %v", from, resp, err)
		}
		return resp.Results[0]
	}
	sum := func() any {
		t.Helper()
		st, err := a.Query(ctx, "p", key)
		if err != nil {
			t.Fatal(err)
		}
		return st.Aggregates["sum"]
	}
	stranger := freeAddr(t)
	steps := []struct {
		what        string
		from        string
		fingerprint uint64
		sum         float64
	}{
		{"a node that is not a member: validated", stranger, p.Fingerprint(), 1},
		{"a member: applied as it read it", b.GRPCAddr(), p.Fingerprint(), 1001},
		{"a member configured differently: validated", b.GRPCAddr(), p.Fingerprint() + 1, 1002},
		{"a itself: validated", a.GRPCAddr(), p.Fingerprint(), 1003},
	}
	for i, s := range steps {
		if r := forward(s.from, fmt.Sprintf("f%d", i), s.fingerprint, nil, nil); r.Error != nil || r.Accepted != 1 {
			t.Fatalf("%s: %v", s.what, r)
		}
		if got := sum(); got != s.sum {
			t.Fatalf("%s: sum %v, want %v", s.what, got, s.sum)
		}
	}
	// What is refused changes nothing: a stranger's invalid event, and a
	// member's share whose prepared fields are not well formed.
	if r := forward(stranger, "", p.Fingerprint(), []byte(`{"k":"`+key+`","v":"ten"}`), []byte{0}); r.Error == nil || codes.Code(r.Error.Code) != codes.InvalidArgument {
		t.Errorf("a stranger's invalid event: %v, want InvalidArgument", r)
	}
	if r := forward(b.GRPCAddr(), "", p.Fingerprint(), ev(key, "f9", 1), []byte{3, 0, 0}); r.Error == nil || codes.Code(r.Error.Code) != codes.InvalidArgument {
		t.Errorf("a member's malformed share: %v, want InvalidArgument", r)
	}
	if got := sum(); got != float64(1003) {
		t.Errorf("sum %v after refused shares, want 1003", got)
	}
}
