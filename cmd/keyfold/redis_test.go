//go:build unix

package main

// End-to-end tests of the Redis store with real processes: a redis-server
// (appendonly yes, appendfsync always) started by the test on a free
// loopback port, and keyfold nodes using it. The same oracle as the crash
// tests checks every key. Batches touch one key group each where a failed
// batch must be resolved by its probe (see workload.groupOf): Redis applies
// the records of different groups in separate script calls.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

const redisGroups = 32

func redisWorkload(seed uint64, writers, minEvents, maxEvents int) *workload {
	w := newWorkload(seed, writers, 200, 40, minEvents, maxEvents)
	w.groupOf = func(pipeline, key string) uint32 { return actors.GroupOf(key, redisGroups) }
	return w
}

// metric returns the value of an unlabelled metric of the node, as text.
func (n *node) metric(name string) (string, error) {
	resp, err := n.client.Get(n.base + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no metric %s", name)
}

// waitServing waits until the node serves every key group again.
func (n *node) waitServing(timeout time.Duration) {
	n.t.Helper()
	waitUntil(n.t, timeout, n.name+" to serve every key group", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("%s exited (%v):\n%s", n.name, n.cmd.ProcessState, n.logs.tail(30))
		}
		v, err := n.metric("keyfold_key_groups_unavailable")
		return err == nil && v == "0", nil
	})
}

// TestRedisCrashRecoveryExactlyOnce is TestCrashRecoveryExactlyOnce on
// Redis: kill -9 the node while writers send, restart it on the same Redis,
// resolve the unacknowledged batches and compare every key with the oracle.
func TestRedisCrashRecoveryExactlyOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	cycles, writers := 3, 3
	if testing.Short() {
		cycles = 2
	}
	cfg := writeConfig(t, fmt.Sprintf("key_groups: %d\ncheckpoint_interval: 20ms\nidle_timeout: 1s\n", redisGroups)+crashMemory+pipelinesYAML)
	w := redisWorkload(seed, writers, 20, 120)
	o := newOracle()
	n := startNode(t, "node-0", cfg, "--redis", srv.URL())
	lookups := 0
	for c := range cycles {
		ws := writeUntil(t, n, w, o, 15+rng.IntN(30), n.kill)
		if t.Failed() {
			t.FailNow()
		}
		n = startNode(t, fmt.Sprintf("node-%d", c+1), cfg, "--redis", srv.URL())
		rs := resolve(t, n, w, o, rng, 10)
		verify(t, n, o, fmt.Sprintf("after crash %d", c+1))
		lookups += rs.idLookups
		t.Logf("cycle %d: killed after %d acked batches, %d unknown; replayed %d records; logins resent: %d new, %d applied, %d in part; clicks unacked: %d applied, %d not; %d ids looked up in the index",
			c, ws.acked, ws.unknown, n.recoveredRecords(), rs.resentNew, rs.resentDup, rs.resentPartial, rs.clicksApplied, rs.clicksDropped, rs.idLookups)
	}
	if lookups == 0 { // (as TestCrashRecoveryExactlyOnce)
		t.Error("no resent id was looked up in the store's id index")
	}
}

// TestRedisOutage kills Redis (SIGKILL) while writers send: the node stays
// up and answers 503 with Retry-After; once Redis is back (from its
// append-only file) the node serves again by itself, and nothing it
// acknowledged is lost, neither in its memory nor after its own restart.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	cfg := writeConfig(t, fmt.Sprintf("key_groups: %d\ncheckpoint_interval: 20ms\n", redisGroups)+pipelinesYAML)
	w := redisWorkload(seed, 3, 20, 120)
	o := newOracle()
	n := startNode(t, "node-0", cfg, "--redis", srv.URL())
	for round := range 2 {
		ws := writeUntil(t, n, w, o, 20+rng.IntN(20), srv.Kill)
		if t.Failed() {
			t.FailNow()
		}
		// Down: the node is up, and ingest answers 503 with Retry-After.
		b := w.next(0)
		o.touch(b)
		req, _ := http.NewRequest(http.MethodPost, n.base+"/v1/pipelines/"+b.pipeline+"/events", bytes.NewReader(b.body))
		req.Header.Set("Content-Type", b.contentType)
		resp, err := n.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), srv.Addr()) {
			t.Errorf("the 503 shows clients the store's address: %s", body)
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("ingest while Redis is down: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		b.state = unknown
		if resp, err := n.client.Get(n.base + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz while Redis is down: %v %v", resp, err)
		}
		srv.Restart()
		n.waitServing(30 * time.Second)
		rs := resolve(t, n, w, o, rng, 10)
		verify(t, n, o, fmt.Sprintf("after Redis outage %d", round+1))
		t.Logf("outage %d: %d acked batches before, %d unknown; logins resent: %d new, %d applied, %d in part; clicks unacked: %d applied, %d not",
			round, ws.acked, ws.unknown+1, rs.resentNew, rs.resentDup, rs.resentPartial, rs.clicksApplied, rs.clicksDropped)
		if len(n.logs.grep("key groups lost")) == 0 {
			t.Error("no lost key groups logged during the outage")
		}
	}
	n.kill()
	n = startNode(t, "node-1", cfg, "--redis", srv.URL())
	verify(t, n, o, "after a restart of the node")
}

// TestTwoNodesOneRedis points two independent nodes at one Redis, both
// receiving events for the same keys. They fence each other over and over
// (each take-over claims the group, fencing the other's writes); writers
// resend every failed logins batch (ids make it safe), to either node. At
// the end a third node, started on the same Redis, must hold exactly the
// acknowledged events: none lost, none doubled.
func TestTwoNodesOneRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	cfg := writeConfig(t, fmt.Sprintf("key_groups: %d\ncheckpoint_interval: 20ms\n", redisGroups)+pipelinesYAML)
	nodes := []*node{
		startNode(t, "node-a", cfg, "--redis", srv.URL()),
		startNode(t, "node-b", cfg, "--redis", srv.URL()),
	}
	const writers = 4
	perWriter := 25
	if testing.Short() {
		perWriter = 12
	}
	w := redisWorkload(seed, writers, 5, 40)
	o := newOracle()
	var (
		mu                 sync.Mutex
		nAcked, failed503s int
		wg                 sync.WaitGroup
	)
	for wr := range writers {
		wrng := rand.New(rand.NewPCG(seed, uint64(100+wr)))
		wg.Go(func() {
			for range perWriter {
				b := w.next(wr)
				mu.Lock()
				o.touch(b)
				mu.Unlock()
				first := time.Now()
				for try := 0; ; try++ {
					n := nodes[wrng.IntN(2)]
					r, status, err := n.post(context.Background(), b)
					if err == nil {
						if r.Accepted+r.Duplicates != len(b.events) {
							t.Errorf("batch %s of %d events: %+v", b.name, len(b.events), r)
						}
						mu.Lock()
						b.state = acked
						o.add(b)
						nAcked++
						mu.Unlock()
						break
					}
					if status != http.StatusServiceUnavailable {
						t.Errorf("batch %s to %s: %v", b.name, n.name, err)
						return
					}
					mu.Lock()
					failed503s++
					mu.Unlock()
					if b.pipeline == "clicks" { // no ids: resolved by its probe at the end
						mu.Lock()
						b.state = unknown
						mu.Unlock()
						break
					}
					if time.Since(first) > time.Minute {
						t.Errorf("batch %s: still failing after %d tries in a minute: %v", b.name, try, err)
						return
					}
					time.Sleep(time.Duration(1+wrng.IntN(10)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	lost := 0
	for _, n := range nodes {
		lost += len(n.logs.grep("key groups lost"))
		if code, _ := n.terminate(30 * time.Second); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM:\n%s", n.name, code, n.logs.tail(20))
		}
	}
	if lost == 0 {
		t.Error("the two nodes never fenced each other")
	}
	n := startNode(t, "node-c", cfg, "--redis", srv.URL())
	rs := resolve(t, n, w, o, rng, 10)
	verify(t, n, o, "after two nodes shared the keys")
	t.Logf("%d batches acked, %d answers 503, %d group losses logged; clicks unacked: %d applied, %d not",
		nAcked, failed503s, lost, rs.clicksApplied, rs.clicksDropped)
}

// TestRedisDownAtStartAndSlow: a node started before its Redis waits for it
// (alive, not ready) instead of exiting; a Redis that stops answering
// (SIGSTOP) makes ingest fail within seconds with 503, never hang, and the
// node serves again once Redis answers.
func TestRedisDownAtStartAndSlow(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Kill()
	cfg := writeConfig(t, fmt.Sprintf("key_groups: %d\n", redisGroups)+pipelinesYAML)
	n := launchNode(t, "node-0", cfg, "--redis", srv.URL())
	waitUntil(t, 10*time.Second, "the node to retry the store", func() (bool, error) {
		return len(n.logs.grep("store unavailable; retrying")) > 0, nil
	})
	for _, probe := range []struct {
		path string
		want int
	}{{"/healthz", http.StatusOK}, {"/readyz", http.StatusServiceUnavailable}} {
		resp, err := n.client.Get(n.base + probe.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != probe.want {
			t.Errorf("%s while Redis is down at start: %d, want %d", probe.path, resp.StatusCode, probe.want)
		}
	}
	srv.Restart()
	n.waitReady(30 * time.Second)

	// Eight writers, one batch each: batches sent at once have no order
	// among themselves, so they touch disjoint keys (the oracle orders a
	// writer's batches as sent). Redis may still run the first commit's
	// append when it answers again, before the node's new claims: then that
	// batch is applied ahead of the resent ones.
	w := redisWorkload(1, 8, 5, 20)
	o := newOracle()
	srv.Pause()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 8 {
		b := w.next(i)
		b.name = fmt.Sprintf("slow-%d", i)
		o.touch(b)
		b.state = unknown // Redis may still run what was sent before it hung
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, status, err := n.post(ctx, b)
			if status != http.StatusServiceUnavailable && status != http.StatusGatewayTimeout {
				t.Errorf("ingest while Redis hangs: status %d, %v; want 503 or 504", status, err)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("8 ingests against a hung Redis failed after %v", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("ingests against a hung Redis took %v to fail", took)
	}
	srv.Resume()
	n.waitServing(30 * time.Second)
	rs := resolve(t, n, w, o, rand.New(rand.NewPCG(1, 1)), 0)
	t.Logf("unacked while Redis hung: logins %d new, %d applied, %d in part; clicks %d applied, %d not",
		rs.resentNew, rs.resentDup, rs.resentPartial, rs.clicksApplied, rs.clicksDropped)
	b := w.next(0)
	o.touch(b)
	n.mustPost(b)
	b.state = acked
	o.add(b)
	verify(t, n, o, "after Redis answered again")
}
