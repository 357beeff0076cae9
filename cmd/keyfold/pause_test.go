//go:build unix

package main

// Guarantee 8 with real processes: a member frozen past its lease (SIGSTOP:
// what a long GC pause or a VM stall does) must not answer queries from the
// memory it kept once it runs again. Three nodes share one Redis; node-a
// holds some keys in memory, clean (checkpointed); it is stopped; the
// others drop it and take its key groups over; more events for those keys
// are acknowledged through node-b; node-a continues. From then on every
// answer to a query for those keys, through any node (node-b and node-c
// forward to node-a once they see it back), must reflect every
// acknowledged event. A refusal (503: not served here now) is allowed.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// pauseLease is the nodes' --cluster-lease in the pause test.
const pauseLease = 3 * time.Second

// keyOwner returns the member id that n says owns a key of pipeline.
func (n *node) keyOwner(pipeline, key string) (string, error) {
	resp, err := n.client.Get(n.base + "/v1/cluster?pipeline=" + url.QueryEscape(pipeline) + "&key=" + url.QueryEscape(key))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /v1/cluster?key=%s: status %d: %s", key, resp.StatusCode, bytes.TrimSpace(body))
	}
	var v struct {
		Key *struct {
			Owner string `json:"owner"`
		} `json:"key"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Key == nil {
		return "", fmt.Errorf("GET /v1/cluster?key=%s: decode %q: %v", key, body, err)
	}
	return v.Key.Owner, nil
}

// queryStatus queries a key and returns the HTTP status with, for 200, the
// state.
func (n *node) queryStatus(ctx context.Context, pipeline, key string) (keyReply, int, error) {
	var r keyReply
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.base+"/v1/pipelines/"+pipeline+"/keys/"+key, nil)
	if err != nil {
		return r, 0, err
	}
	status, err := doJSON(n.client, req, &r)
	return r, status, err
}

// postAcked sends a batch (events with ids) until a node acknowledges it,
// resending after 503s, and adds it to the oracle.
func postAcked(t *testing.T, n *member, b *batch, o *oracle) {
	t.Helper()
	o.touch(b)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, status, err := n.post(ctx, b)
		cancel()
		if err == nil {
			if r.Accepted+r.Duplicates != len(b.events) {
				t.Fatalf("%s: batch %s of %d events: got %+v", n.name, b.name, len(b.events), r)
			}
			b.state = acked
			o.add(b)
			return
		}
		if status != 0 && status != http.StatusServiceUnavailable && status != http.StatusGatewayTimeout {
			t.Fatalf("%s: batch %s: %v", n.name, b.name, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: batch %s still not acknowledged after 30s: %v", n.name, b.name, err)
		}
		time.Sleep(20 * time.Millisecond) // backoff before resending
	}
}

// loginsBatch is a batch of each logins events for each key, with ids
// unique to the batch.
func loginsBatch(name string, keys []string, each int, amount int64) *batch {
	b := &batch{name: name, pipeline: "logins"}
	for _, k := range keys {
		for i := range each {
			b.events = append(b.events, event{key: k, id: fmt.Sprintf("%s-%s-%d", name, k, i), failed: i%2 == 0, amount: amount + int64(i)})
		}
	}
	b.encode(false)
	return b
}

// pauseReads is what one reader saw through one node after the resume.
type pauseReads struct {
	fresh, refused, stale int
	freshAfterStable      int // fresh answers to queries sent after the cluster was stable again
	examples              []string
	firstFresh            time.Time
}

// check counts an answer to a query for k sent at sent, fresh or stale
// (different from the key's expectation alone, want); true if fresh.
func (res *pauseReads) check(want *oracle, k string, r keyReply, sent, resumedAt time.Time) bool {
	if d := diff(want, map[pkey]observed{{"logins", k}: {found: true, r: r}}); len(d) > 0 {
		res.stale++
		if len(res.examples) < 5 {
			res.examples = append(res.examples, fmt.Sprintf("sent %v after the resume: %s", sent.Sub(resumedAt).Round(time.Millisecond), d[0]))
		}
		return false
	}
	res.fresh++
	if res.firstFresh.IsZero() {
		res.firstFresh = time.Now()
	}
	return true
}

// perKey returns each key's expectation alone (for diff, which reports
// every key of its oracle).
func perKey(o *oracle, keys []string) map[string]*oracle {
	out := map[string]*oracle{}
	for _, k := range keys {
		x, pk := newOracle(), pkey{"logins", k}
		e := *o.keys[pk]
		x.keys[pk], x.universe[pk] = &e, true
		out[k] = x
	}
	return out
}

// While Redis is stopped after the member resumes (cutOff), its keys are
// queried through it for cutOffFor, each query given cutOffQueryTimeout
// (a refused read is routed again until the request ends).
const (
	cutOffFor          = 800 * time.Millisecond
	cutOffQueryTimeout = 300 * time.Millisecond
)

// readCutOff queries every key through m, concurrently and again and
// again, for cutOffFor from the resume.
func readCutOff(t *testing.T, m *member, keys []string, o *oracle, resumedAt time.Time) pauseReads {
	t.Helper()
	want := perKey(o, keys)
	var (
		mu  sync.Mutex
		res pauseReads
		wg  sync.WaitGroup
	)
	for _, k := range keys {
		wg.Go(func() {
			for time.Since(resumedAt) < cutOffFor {
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), cutOffQueryTimeout)
				r, status, err := m.queryStatus(ctx, "logins", k)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					res.check(want[k], k, r, sent, resumedAt)
				case status == http.StatusServiceUnavailable || status == 0 && errors.Is(err, context.DeadlineExceeded):
					res.refused++
				default:
					t.Errorf("query %s through %s while Redis is stopped: %v", k, m.name, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

// TestClusterPausedMemberServesNoStaleReads: a member frozen (SIGSTOP) for
// one and a half leases, whose groups the others took over and wrote to,
// must not answer from its memory after it resumes, neither directly nor
// for the members that forward to it.
func TestClusterPausedMemberServesNoStaleReads(t *testing.T) {
	testPausedMember(t, false)
}

// TestClusterPausedMemberCutOffServesNoStaleReads is the same pause, but
// the member resumes while the store does not answer (Redis is stopped
// just before): it cannot learn that its lease ran out, and must refuse to
// answer from memory all the same, since its lease is not confirmed.
func TestClusterPausedMemberCutOffServesNoStaleReads(t *testing.T) {
	testPausedMember(t, true)
}

// testPausedMember runs the pause scenario; with cutOff, Redis is stopped
// from just before the member resumes until cutOffFor after, while the
// member's keys are queried through it.
func testPausedMember(t *testing.T, cutOff bool) {
	t.Parallel()
	srv := redistest.Start(t)
	// Checkpoints every second: node-a's keys are clean (in their snapshots)
	// before it is stopped, so nothing it does after it resumes writes to
	// their groups (a write would be fenced, and would make it replay).
	cfg := writeConfig(t, "checkpoint_interval: 1s\n"+pipelinesYAML)
	args := []string{"--redis", srv.URL(), "--cluster", "pause", "--cluster-lease", pauseLease.String()}
	var ms []*member
	for i := range 3 {
		ms = append(ms, &member{node: launchNode(t, fmt.Sprintf("node-%c", 'a'+i), cfg, args...)})
	}
	for _, m := range ms {
		m.waitJoined()
	}
	waitStable(t, ms, 30*time.Second, "of 3 nodes")
	a, b, c := ms[0], ms[1], ms[2]

	// Keys whose group node-a owns.
	var keys []string
	for i := 0; len(keys) < 16; i++ {
		if i >= 1000 {
			t.Fatalf("only %d of 1000 keys are owned by %s", len(keys), a.name)
		}
		k := fmt.Sprintf("u%03d", i)
		owner, err := b.keyOwner("logins", k)
		if err != nil {
			t.Fatal(err)
		}
		if owner == a.id {
			keys = append(keys, k)
		}
	}
	o := newOracle()

	// The keys get events through node-a and are read through it: their
	// actors are in its memory. Then a checkpoint passes: they are clean.
	postAcked(t, a, loginsBatch("before", keys, 3, 10), o)
	verify(t, a.node, o, "through node-a before the pause")
	waitUntil(t, 20*time.Second, "node-a to checkpoint its keys", func() (bool, error) {
		v, err := a.metric("keyfold_dirty_keys")
		return err == nil && v == "0", nil
	})
	active, err := a.metric("keyfold_active_keys")
	if err != nil || active == "0" {
		t.Fatalf("node-a holds %q keys in memory (%v), want the test's keys", active, err)
	}

	// node-a is frozen; the others drop it after its lease and take its
	// groups over; more events for its keys are acknowledged through node-b.
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", a.name, err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT %s: %v", a.name, err)
			}
		}
	}
	t.Cleanup(resume) // before the nodes are killed, if the test ends early
	waitStable(t, []*member{b, c}, 30*time.Second, "without the stopped "+a.name)
	tookOver := time.Since(stopped)
	postAcked(t, b, loginsBatch("during", keys, 2, 100), o)
	verify(t, b.node, o, "through node-b while node-a is stopped")
	// Stopped for one and a half leases in all (pacing: the scenario's
	// length, not an assertion).
	time.Sleep(time.Until(stopped.Add(pauseLease * 3 / 2)))
	var cut pauseReads
	if cutOff {
		srv.Pause()
	}
	resume()
	resumedAt := time.Now()
	if cutOff {
		cut = readCutOff(t, a, keys, o, resumedAt)
		srv.Resume()
		t.Logf("figure: through %s while Redis was stopped for %v after the resume: %d fresh answers, %d refused (503 or no answer in %v), %d stale",
			a.name, cutOffFor, cut.fresh, cut.refused, cutOffQueryTimeout, cut.stale)
		if cut.stale > 0 {
			t.Errorf("through %s while Redis was stopped: %d answers older than acknowledged writes, e.g.:\n  %s", a.name, cut.stale, strings.Join(cut.examples, "\n  "))
		}
	}

	// Every node is queried for every key, continuously, from the resume
	// until the cluster is stable again and then some. The oracle no longer
	// changes: every 200 must equal it.
	wantKey := perKey(o, keys)
	var (
		stable  atomic.Int64 // unix nanos when the cluster was seen stable again
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		results = make([]pauseReads, len(ms))
		rounds  = make([]atomic.Int64, len(ms)) // full rounds sent after stable
	)
	for i, m := range ms {
		wg.Go(func() {
			res := &results[i]
			for {
				select {
				case <-stop:
					return
				default:
				}
				roundAfterStable := stable.Load() != 0
				for _, k := range keys {
					sent := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					r, status, err := m.queryStatus(ctx, "logins", k)
					cancel()
					switch {
					case err == nil:
						if !res.check(wantKey[k], k, r, sent, resumedAt) {
							continue
						}
						if s := stable.Load(); s != 0 && sent.UnixNano() > s {
							res.freshAfterStable++
						}
					case status == http.StatusServiceUnavailable:
						res.refused++
					default:
						t.Errorf("query %s through %s: %v", k, m.name, err)
						return
					}
				}
				if roundAfterStable {
					rounds[i].Add(1)
				}
			}
		})
	}
	stopReaders := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	t.Cleanup(stopReaders)
	waitStable(t, ms, 60*time.Second, "after "+a.name+" resumed")
	stable.Store(time.Now().UnixNano())
	stableAfter := time.Since(resumedAt)
	// Go on reading until two leases after the resume and until every
	// reader has done a full round after the cluster was stable.
	waitUntil(t, 60*time.Second, "a full round of queries through every node after the cluster is stable", func() (bool, error) {
		for i := range rounds {
			if rounds[i].Load() == 0 {
				return false, nil
			}
		}
		return time.Since(resumedAt) > 2*pauseLease, nil
	})
	stopReaders()

	t.Logf("figure: %s stopped for %v; the others served its groups %v after the stop; stable again %v after the resume; %s logged its lease lapsed %d times",
		a.name, resumedAt.Sub(stopped).Round(time.Millisecond), tookOver.Round(time.Millisecond), stableAfter.Round(time.Millisecond),
		a.name, len(a.logs.grep(`msg="membership lease lapsed`)))
	for i, m := range ms {
		r := results[i]
		first := "never"
		if !r.firstFresh.IsZero() {
			first = r.firstFresh.Sub(resumedAt).Round(time.Millisecond).String() + " after the resume"
		}
		t.Logf("figure: through %s: %d fresh answers (first %s), %d refused (503), %d stale", m.name, r.fresh, first, r.refused, r.stale)
	}
	for i, m := range ms {
		r := results[i]
		if r.stale > 0 {
			t.Errorf("through %s: %d answers older than acknowledged writes, e.g.:\n  %s", m.name, r.stale, strings.Join(r.examples, "\n  "))
		}
		if r.freshAfterStable == 0 {
			t.Errorf("through %s: no fresh answer to a query sent after the cluster was stable again", m.name)
		}
	}
	for _, m := range ms {
		verify(t, m.node, o, "through "+m.name+" at the end")
	}
}
