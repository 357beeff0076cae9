//go:build unix

package main

// End-to-end tests of guarantees 1–3 (ack means durable, per-key order,
// exactly-once effect) with real processes: the keyfold binary is built once,
// nodes are started on the embedded store in a temp dir, killed with SIGKILL
// or drained with SIGTERM, restarted on the same data, and every key's state
// is compared with an oracle computed from the batches the test sent.
//
// Two pipelines are used. "logins" carries an event id, so a batch whose
// outcome is unknown (the connection died) is resent and must count once.
// "clicks" has no id, so it cannot be retried; each of its batches carries a
// probe event for a key that only that batch touches, and after a restart
// the probe tells whether the batch was applied (then it counts in the
// oracle) or not (then it must have left no trace). Because dedup cannot
// hide a record that recovery replays twice, the clicks pipeline is what
// catches double application of the log.
//
// Set KEYFOLD_CRASH_SEED to replay a run's random choices (the seed is
// logged); timing still differs from run to run.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---- the binary ----------------------------------------------------------

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == curlName { // readme_test.go runs this binary as its curl
		os.Exit(curlMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// keyfoldBinary builds ./cmd/keyfold once per test binary run and returns
// its path. The go command is found on PATH (go test puts GOROOT/bin first)
// and inherits the environment, GOFLAGS included.
func keyfoldBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		goCmd, err := exec.LookPath("go")
		if err != nil {
			binErr = fmt.Errorf("the go command is needed to build keyfold: %w", err)
			return
		}
		if binDir, err = os.MkdirTemp("", "keyfold-e2e-"); err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(binDir, "keyfold")
		cmd := exec.Command(goCmd, "build", "-o", binPath, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/keyfold: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// ---- nodes ---------------------------------------------------------------

// node is one keyfold process started by the test.
type node struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	logs   *logSink
	base   string // http://host:port
	client *http.Client
	exited chan struct{} // closed once the process was reaped
}

var (
	listeningRE = regexp.MustCompile(`msg=listening http=(\S+)`)
	recoveredRE = regexp.MustCompile(`msg=recovered .*\brecords=(\d+)`)
)

// startNode starts `keyfold serve` on cfg and the store named by storeArgs
// ("--data", dir or "--redis", url) and waits until it is ready.
func startNode(t *testing.T, name, cfg string, storeArgs ...string) *node {
	t.Helper()
	n := launchNode(t, name, cfg, storeArgs...)
	n.waitReady(30 * time.Second)
	return n
}

// launchNode starts `keyfold serve` and waits until it listens. It binds
// port 0 and reads the bound address from the log, so there is no window in
// which another process can take the port.
func launchNode(t *testing.T, name, cfg string, storeArgs ...string) *node {
	t.Helper()
	return launch(t, name, exec.Command(keyfoldBinary(t), append([]string{"serve", "--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, storeArgs...)...))
}

// launch starts cmd, a `keyfold serve` whose HTTP API listens on port 0,
// and waits until it listens, as launchNode.
func launch(t *testing.T, name string, cmd *exec.Cmd) *node {
	t.Helper()
	n := &node{
		t:      t,
		name:   name,
		cmd:    cmd,
		logs:   newLogSink(),
		exited: make(chan struct{}),
	}
	n.cmd.Stdout = n.logs
	n.cmd.Stderr = n.logs
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("%s: start: %v", name, err)
	}
	go func() {
		_ = n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		n.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("%s: pid %d log:\n%s", name, n.cmd.Process.Pid, n.logs.tail(60))
		}
	})

	var addr string
	waitUntil(t, 60*time.Second, name+" to listen", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("%s exited before listening (%v):\n%s", name, n.cmd.ProcessState, n.logs.tail(30))
		}
		m := n.logs.find(listeningRE)
		if m == nil {
			return false, nil
		}
		addr = m[1]
		return true, nil
	})
	n.base = "http://" + addr
	n.client = &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true},
	}
	t.Cleanup(n.client.CloseIdleConnections)
	return n
}

// waitReady waits until the node's /readyz answers 200.
func (n *node) waitReady(timeout time.Duration) {
	n.t.Helper()
	waitUntil(n.t, timeout, n.name+" /readyz", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("%s exited before ready (%v):\n%s", n.name, n.cmd.ProcessState, n.logs.tail(30))
		}
		resp, err := n.client.Get(n.base + "/readyz")
		if err != nil {
			return false, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (n *node) hasExited() bool {
	select {
	case <-n.exited:
		return true
	default:
		return false
	}
}

// stop signals the process (ours, by its PID) unless it already exited, and
// waits for it to be reaped.
func (n *node) stop(sig syscall.Signal) {
	if !n.hasExited() {
		_ = n.cmd.Process.Signal(sig)
	}
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

// kill sends SIGKILL and checks that it is what ended the process (and not,
// say, a panic just before).
func (n *node) kill() {
	n.t.Helper()
	if n.hasExited() {
		n.t.Fatalf("%s had exited before the kill (%v):\n%s", n.name, n.cmd.ProcessState, n.logs.tail(30))
	}
	n.stop(syscall.SIGKILL)
	ws, ok := n.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		n.t.Fatalf("%s: want death by SIGKILL, got %v:\n%s", n.name, n.cmd.ProcessState, n.logs.tail(30))
	}
	n.client.CloseIdleConnections()
}

// terminate sends SIGTERM and returns the exit code and how long the
// process took to exit. It fails the test if the process outlives timeout.
func (n *node) terminate(timeout time.Duration) (int, time.Duration) {
	n.t.Helper()
	start := time.Now()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatalf("%s: SIGTERM: %v", n.name, err)
	}
	select {
	case <-n.exited:
	case <-time.After(timeout):
		n.t.Fatalf("%s did not exit within %v of SIGTERM:\n%s", n.name, timeout, n.logs.tail(30))
	}
	return n.cmd.ProcessState.ExitCode(), time.Since(start)
}

// recoveredRecords returns N of the node's `msg=recovered ... records=N`.
func (n *node) recoveredRecords() int {
	n.t.Helper()
	// The line is written before the node turns ready, but this process
	// copies the node's stderr on its own goroutine: wait for it a little.
	var m []string
	waitUntil(n.t, 5*time.Second, n.name+"'s msg=recovered line", func() (bool, error) {
		m = n.logs.find(recoveredRE)
		return m != nil, nil
	})
	v, err := strconv.Atoi(m[1])
	if err != nil {
		n.t.Fatal(err)
	}
	return v
}

// ingestReply is the body of a 200 answer to an ingest.
type ingestReply struct {
	Accepted   int `json:"accepted"`
	Duplicates int `json:"duplicates"`
}

// post sends a batch. err is a transport error (the outcome is unknown);
// otherwise status is the HTTP status and, for 200, reply its body.
func (n *node) post(ctx context.Context, b *batch) (reply ingestReply, status int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.base+"/v1/pipelines/"+b.pipeline+"/events", bytes.NewReader(b.body))
	if err != nil {
		return reply, 0, err
	}
	req.Header.Set("Content-Type", b.contentType)
	status, err = doJSON(n.client, req, &reply)
	return reply, status, err
}

// doJSON sends req and decodes a 200's JSON body into v; another status is
// an error with the body, returned with the status (0: no answer).
func doJSON(c *http.Client, req *http.Request, v any) (int, error) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, fmt.Errorf("decode %q: %w", body, err)
	}
	return resp.StatusCode, nil
}

// mustPost sends a batch to a node that must accept it.
func (n *node) mustPost(b *batch) ingestReply {
	n.t.Helper()
	r, _, err := n.post(context.Background(), b)
	if err != nil {
		n.t.Fatalf("%s: batch %s: %v", n.name, b.name, err)
	}
	if r.Accepted+r.Duplicates != len(b.events) {
		n.t.Fatalf("%s: batch %s of %d events: got %+v", n.name, b.name, len(b.events), r)
	}
	return r
}

// keyReply is the body of a 200 answer to a key query.
type keyReply struct {
	Pipeline   string                     `json:"pipeline"`
	Key        string                     `json:"key"`
	Seq        uint64                     `json:"seq"`
	Aggregates map[string]json.RawMessage `json:"aggregates"`
}

// query returns a key's state, or found=false on 404.
func (n *node) query(pipeline, key string) (r keyReply, found bool, err error) {
	resp, err := n.client.Get(n.base + "/v1/pipelines/" + pipeline + "/keys/" + key)
	if err != nil {
		return r, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, false, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if err := json.Unmarshal(body, &r); err != nil {
			return r, false, fmt.Errorf("query %s/%s: decode %q: %w", pipeline, key, body, err)
		}
		return r, true, nil
	case http.StatusNotFound:
		return r, false, nil
	}
	return r, false, fmt.Errorf("query %s/%s: status %d: %s", pipeline, key, resp.StatusCode, bytes.TrimSpace(body))
}

// logSink collects a process's output and lets the test search it.
type logSink struct {
	mu      sync.Mutex
	lines   []string
	partial []byte
}

func newLogSink() *logSink { return &logSink{} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		s.lines = append(s.lines, string(s.partial[:i]))
		s.partial = s.partial[i+1:]
	}
	return len(p), nil
}

func (s *logSink) find(re *regexp.Regexp) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if m := re.FindStringSubmatch(l); m != nil {
			return m
		}
	}
	return nil
}

func (s *logSink) grep(substr string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lines {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

func (s *logSink) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	lines := s.lines[max(0, len(s.lines)-n):]
	out := strings.Join(lines, "\n")
	if len(s.partial) > 0 {
		out += "\n" + string(s.partial)
	}
	return out
}

// waitUntil polls cond until it reports true, fails the test if cond
// returns an error or timeout passes first.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// writeConfig writes a node configuration into the test's temp dir.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keyfold.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The pipelines all tests use. The oracle below knows their aggregates.
const pipelinesYAML = `
pipelines:
  logins:
    key: user_id
    id: event_id
    aggregates:
      total:       { op: count }
      failed:      { op: count, where: "type == 'login_failed'" }
      amount:      { op: sum, field: amount }
      biggest:     { op: max, field: amount }
      last_amount: { op: last, field: amount }
  clicks:
    key: page
    aggregates:
      hits:   { op: count }
      weight: { op: sum, field: n }
`

// testSeed returns the seed of a test's random choices and logs it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KEYFOLD_CRASH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KEYFOLD_CRASH_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (set KEYFOLD_CRASH_SEED to reuse)", seed)
	return seed
}

// ---- workload and oracle -------------------------------------------------

type event struct {
	key    string
	id     string // "" in clicks
	failed bool
	amount int64
}

type loginJSON struct {
	UserID  string `json:"user_id"`
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Amount  int64  `json:"amount"`
}

type clickJSON struct {
	Page string `json:"page"`
	N    int64  `json:"n"`
}

// batch is one ingest request.
type batch struct {
	name        string
	writer      int
	pipeline    string
	events      []event
	body        []byte
	contentType string
	probe       string // clicks: the key only this batch touches
	state       batchState
}

type batchState int

const (
	pending  batchState = iota
	acked               // 200 received, or resent until it was
	unknown             // the connection failed: applied or not
	dropped             // clicks batch never acked and not applied
	recorded            // clicks batch never acked but applied
)

// encode renders the batch as a JSON array or, if ndjson, as NDJSON.
func (b *batch) encode(ndjson bool) {
	docs := make([]any, len(b.events))
	for i, e := range b.events {
		switch b.pipeline {
		case "logins":
			typ := "login"
			if e.failed {
				typ = "login_failed"
			}
			docs[i] = loginJSON{UserID: e.key, EventID: e.id, Type: typ, Amount: e.amount}
		case "clicks":
			docs[i] = clickJSON{Page: e.key, N: e.amount}
		}
	}
	var buf bytes.Buffer
	if ndjson {
		enc := json.NewEncoder(&buf)
		for _, d := range docs {
			if err := enc.Encode(d); err != nil {
				panic(err)
			}
		}
		b.body, b.contentType = buf.Bytes(), "application/x-ndjson"
		return
	}
	body, err := json.Marshal(docs)
	if err != nil {
		panic(err)
	}
	b.body, b.contentType = body, "application/json"
}

// pkey names a key of a pipeline.
type pkey struct{ pipeline, key string }

// expect is what the oracle says about one key.
type expect struct {
	n      int64 // events applied (seq, count)
	failed int64
	sum    int64
	max    int64
	last   int64
}

// oracle folds the batches known to be applied, each exactly once, in the
// order the test knows they were applied per key.
type oracle struct {
	mu       sync.Mutex
	keys     map[pkey]*expect
	universe map[pkey]bool // every key any batch sent touched
}

func newOracle() *oracle {
	return &oracle{keys: map[pkey]*expect{}, universe: map[pkey]bool{}}
}

func (o *oracle) touch(b *batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range b.events {
		o.universe[pkey{b.pipeline, e.key}] = true
	}
}

func (o *oracle) add(b *batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range b.events {
		k := pkey{b.pipeline, e.key}
		o.universe[k] = true
		x := o.keys[k]
		if x == nil {
			x = &expect{max: e.amount}
			o.keys[k] = x
		}
		x.n++
		if e.failed {
			x.failed++
		}
		x.sum += e.amount
		x.max = max(x.max, e.amount)
		x.last = e.amount
	}
}

func (o *oracle) clone() *oracle {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := newOracle()
	for k, v := range o.keys {
		x := *v
		c.keys[k] = &x
	}
	maps.Copy(c.universe, o.universe)
	return c
}

// observed is a key's state as the node reports it.
type observed struct {
	found bool
	r     keyReply
}

// observe queries every key of the oracle's universe, a few at a time.
func observe(t *testing.T, n *node, o *oracle) map[pkey]observed {
	t.Helper()
	o.mu.Lock()
	keys := slices.Collect(maps.Keys(o.universe))
	o.mu.Unlock()
	out := make(map[pkey]observed, len(keys))
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		next atomic.Int64
		errs []error
	)
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				k := keys[i]
				r, found, err := n.query(k.pipeline, k.key)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				out[k] = observed{found: found, r: r}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%s: queries failed: %v", n.name, err)
	}
	return out
}

// diff compares observed states with the oracle and describes every key
// that differs.
func diff(o *oracle, obs map[pkey]observed) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for k := range o.universe {
		got := obs[k]
		want := o.keys[k]
		if want == nil {
			if got.found {
				out = append(out, fmt.Sprintf("%s/%s: want 404 (nothing applied), got seq=%d %s", k.pipeline, k.key, got.r.Seq, aggString(got.r)))
			}
			continue
		}
		if !got.found {
			out = append(out, fmt.Sprintf("%s/%s: want seq=%d, got 404", k.pipeline, k.key, want.n))
			continue
		}
		wantAggs := map[string]float64{}
		switch k.pipeline {
		case "logins":
			wantAggs["total"] = float64(want.n)
			wantAggs["failed"] = float64(want.failed)
			wantAggs["amount"] = float64(want.sum)
			wantAggs["biggest"] = float64(want.max)
			wantAggs["last_amount"] = float64(want.last)
		case "clicks":
			wantAggs["hits"] = float64(want.n)
			wantAggs["weight"] = float64(want.sum)
		}
		var bad []string
		if got.r.Seq != uint64(want.n) {
			bad = append(bad, fmt.Sprintf("seq=%d want %d", got.r.Seq, want.n))
		}
		for _, name := range slices.Sorted(maps.Keys(wantAggs)) {
			var v *float64
			raw, ok := got.r.Aggregates[name]
			if ok {
				if err := json.Unmarshal(raw, &v); err != nil {
					bad = append(bad, fmt.Sprintf("%s=%s (not a number)", name, raw))
					continue
				}
			}
			if v == nil || *v != wantAggs[name] {
				bad = append(bad, fmt.Sprintf("%s=%s want %v", name, raw, wantAggs[name]))
			}
		}
		if len(bad) > 0 {
			out = append(out, fmt.Sprintf("%s/%s: %s", k.pipeline, k.key, strings.Join(bad, ", ")))
		}
	}
	slices.Sort(out)
	return out
}

func aggString(r keyReply) string {
	b, _ := json.Marshal(r.Aggregates)
	return string(b)
}

// verify fails the test unless every key's state equals the oracle's.
func verify(t *testing.T, n *node, o *oracle, when string) {
	t.Helper()
	obs := observe(t, n, o)
	if d := diff(o, obs); len(d) > 0 {
		t.Fatalf("%s: %d of %d keys differ from the oracle (lost, doubled or reordered events):\n  %s",
			when, len(d), len(obs), strings.Join(d[:min(len(d), 25)], "\n  "))
	}
}

// workload generates the batches of concurrent writers. Each writer owns a
// disjoint set of keys and sends one batch at a time, so the order in which
// a key's events are applied is the order of its writer's batches: that
// makes `last` deterministic even across crashes, as long as a writer's
// unknown batch is resolved before it sends another.
type workload struct {
	writers   int
	logins    int // keys of the logins pipeline
	pages     int // keys of the clicks pipeline
	minEvents int
	maxEvents int
	rngs      []*rand.Rand // per writer
	seqs      []int        // per writer: batches generated

	mu      sync.Mutex
	batches [][]*batch // per writer, in send order

	// groupOf, if set, makes every clicks batch touch one key group: one
	// page and a probe of the same group. A store that appends the records
	// of several groups in separate writes (Redis) may apply a failed batch
	// in part, but never a group's share of it in part, so the probe still
	// tells whether the batch was applied. It also allows resent logins
	// batches to have been applied in part.
	groupOf func(pipeline, key string) uint32
}

func newWorkload(seed uint64, writers, logins, pages, minEvents, maxEvents int) *workload {
	w := &workload{
		writers: writers, logins: logins, pages: pages, minEvents: minEvents, maxEvents: maxEvents,
		rngs: make([]*rand.Rand, writers), seqs: make([]int, writers), batches: make([][]*batch, writers),
	}
	for i := range writers {
		w.rngs[i] = rand.New(rand.NewPCG(seed, uint64(i)+1))
	}
	return w
}

// next generates writer wr's next batch: half are logins events
// with unique ids, half clicks events without ids plus a probe.
func (w *workload) next(wr int) *batch {
	rng := w.rngs[wr]
	w.seqs[wr]++
	b := &batch{name: fmt.Sprintf("w%d-b%d", wr, w.seqs[wr]), writer: wr}
	count := w.minEvents + rng.IntN(w.maxEvents-w.minEvents+1)
	if rng.IntN(2) == 0 {
		b.pipeline = "clicks"
		b.probe = "probe-" + b.name
		var page string // the batch's one page, with groupOf
		if w.groupOf != nil {
			page = fmt.Sprintf("p%03d", wr+w.writers*rng.IntN(w.pages/w.writers))
			for i := 0; w.groupOf("clicks", b.probe) != w.groupOf("clicks", page); i++ {
				b.probe = fmt.Sprintf("probe-%s-%d", b.name, i)
			}
		}
		b.events = append(b.events, event{key: b.probe, amount: 1})
		for range count / 2 {
			key := page
			if key == "" {
				key = fmt.Sprintf("p%03d", wr+w.writers*rng.IntN(w.pages/w.writers))
			}
			b.events = append(b.events, event{key: key, amount: 1 + rng.Int64N(9)})
		}
	} else {
		b.pipeline = "logins"
		for i := range count {
			user := wr + w.writers*rng.IntN(w.logins/w.writers)
			b.events = append(b.events, event{
				key:    fmt.Sprintf("u%03d", user),
				id:     fmt.Sprintf("%s-e%d", b.name, i),
				failed: rng.IntN(3) == 0,
				amount: 1 + rng.Int64N(1000),
			})
		}
	}
	b.encode(rng.IntN(3) == 0)
	w.mu.Lock()
	w.batches[wr] = append(w.batches[wr], b)
	w.mu.Unlock()
	return b
}

// writeStats is what a writing phase did.
type writeStats struct {
	acked, unknown int
	ackedAfter     int      // acked although sent or answered after the signal
	failures       []string // why the unknown batches failed
}

// writeUntil runs the writers against n until it goes down: once at least
// target batches were acked in this phase and some are in flight, it calls
// signal (which kills or terminates n); writers stop at their first failed
// request. Every fresh batch must be accepted whole.
func writeUntil(t *testing.T, n *node, w *workload, o *oracle, target int, signal func()) writeStats {
	t.Helper()
	var (
		ackedN, inflight atomic.Int64
		running          atomic.Int64
		signalled        atomic.Bool
		wg               sync.WaitGroup
		mu               sync.Mutex
		st               writeStats
	)
	stop := make(chan struct{})
	running.Store(int64(w.writers))
	for wr := range w.writers {
		wg.Go(func() {
			defer running.Add(-1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				b := w.next(wr)
				o.touch(b)
				inflight.Add(1)
				r, status, err := n.post(context.Background(), b)
				inflight.Add(-1)
				mu.Lock()
				if err == nil {
					if r.Accepted != len(b.events) || r.Duplicates != 0 {
						t.Errorf("fresh batch %s of %d events: got %+v", b.name, len(b.events), r)
					}
					b.state = acked
					o.add(b)
					st.acked++
					if signalled.Load() {
						st.ackedAfter++
					}
					mu.Unlock()
					ackedN.Add(1)
					continue
				}
				b.state = unknown
				st.unknown++
				st.failures = append(st.failures, err.Error())
				mu.Unlock()
				if status != 0 && status != http.StatusServiceUnavailable {
					t.Errorf("batch %s: %v", b.name, err)
				}
				if status == http.StatusServiceUnavailable && !signalled.Load() {
					t.Errorf("batch %s: 503 before the node was signalled: %v", b.name, err)
				}
				return
			}
		})
	}
	waitUntil(t, 60*time.Second, fmt.Sprintf("%d acked batches with some in flight", target), func() (bool, error) {
		if ackedN.Load() >= int64(target) && inflight.Load() > 0 {
			return true, nil
		}
		if n.hasExited() || running.Load() == 0 {
			return false, fmt.Errorf("%s went down or every writer failed before the signal:\n%s", n.name, n.logs.tail(30))
		}
		return false, nil
	})
	signalled.Store(true)
	signal()
	close(stop)
	wg.Wait()
	return st
}

// crashMemory is the kill -9 tests' memory: so small that keys leave memory
// for the store (without a snapshot cache), as at a million keys; only
// then do checkpoints index ids, so that resent ids are looked up.
const crashMemory = "max_memory: 65536\n"

// resolveStats is what resolving the unknown batches found.
type resolveStats struct {
	resentNew, resentDup int // logins batches: not applied before / applied before
	resentPartial        int // logins batches applied in part (only with workload.groupOf)
	clicksApplied        int
	clicksDropped        int
	sampledDups          int
	// idLookups counts the events whose id the node looked up in its
	// store's id index (keyfold_id_lookups_total): resent ids of keys
	// restored from snapshots that hold only their fingerprints.
	idLookups int
}

// resolve settles every unknown batch on a restarted node, in each writer's
// order: a logins batch is resent and must be all new or all duplicate; a
// clicks batch is looked up by its probe. Then it resends up to sample
// already acked logins batches, which must be all duplicates.
func resolve(t *testing.T, n *node, w *workload, o *oracle, rng *rand.Rand, sample int) resolveStats {
	t.Helper()
	var st resolveStats
	var ackedLogins []*batch
	for wr := range w.writers {
		for _, b := range w.batches[wr] {
			if b.state == acked && b.pipeline == "logins" {
				ackedLogins = append(ackedLogins, b)
			}
			if b.state != unknown {
				continue
			}
			switch b.pipeline {
			case "logins":
				r := n.mustPost(b)
				switch {
				case r.Duplicates == 0:
					st.resentNew++
				case r.Accepted == 0:
					st.resentDup++
				case w.groupOf != nil:
					st.resentPartial++
				default:
					t.Fatalf("batch %s was partly applied before the crash: resending it gave %+v", b.name, r)
				}
				b.state = acked
				o.add(b)
			case "clicks":
				r, found, err := n.query("clicks", b.probe)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case !found:
					st.clicksDropped++
					b.state = dropped
				case r.Seq == 1:
					st.clicksApplied++
					b.state = recorded
					o.add(b)
				default:
					t.Fatalf("probe of unacked clicks batch %s has seq %d, want 1 or 404: the batch was applied more than once", b.name, r.Seq)
				}
			}
		}
	}
	rng.Shuffle(len(ackedLogins), func(i, j int) { ackedLogins[i], ackedLogins[j] = ackedLogins[j], ackedLogins[i] })
	for _, b := range ackedLogins[:min(sample, len(ackedLogins))] {
		if r := n.mustPost(b); r.Accepted != 0 {
			t.Fatalf("resending acked batch %s: got %+v, want all %d duplicates", b.name, r, len(b.events))
		}
		st.sampledDups++
	}
	v, err := n.metric("keyfold_id_lookups_total")
	if err != nil {
		t.Fatal(err)
	}
	if st.idLookups, err = strconv.Atoi(v); err != nil {
		t.Fatalf("keyfold_id_lookups_total %q: %v", v, err)
	}
	return st
}

// ---- the tests -----------------------------------------------------------

// TestCrashRecoveryExactlyOnce kills a node with SIGKILL while several
// writers are sending, restarts it on the same data, resends what was not
// acknowledged (and some of what was), and checks every key against the
// oracle; several times over the same data.
func TestCrashRecoveryExactlyOnce(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))

	cycles, writers, minEv, maxEv, minTarget, maxTarget := 6, 4, 50, 200, 20, 60
	if testing.Short() {
		cycles, writers, minEv, maxEv, minTarget, maxTarget = 3, 3, 20, 80, 10, 25
	}
	// A checkpoint interval this short keeps checkpoints running nearly all
	// the time, so a kill finds keys in snapshots, keys only in the log, and
	// groups whose snapshots are written but whose log is not yet trimmed
	// (where replaying a record twice would show). Fewer key groups than the
	// default make restarts quick (a claim is a synced write per group) and
	// put many keys in each group. A short idle timeout also passivates
	// keys and reactivates them from their snapshots. A small max_memory
	// (10 active keys, a few dozen resident) makes keys leave memory for
	// the store, which turns the id index on (actors.Config.AlwaysIndexIDs).
	cfg := writeConfig(t, "key_groups: 32\ncheckpoint_interval: 20ms\nidle_timeout: 1s\n"+crashMemory+pipelinesYAML)
	data := t.TempDir()
	w := newWorkload(seed, writers, 200, 40, minEv, maxEv)
	o := newOracle()

	n := startNode(t, "node-0", cfg, "--data", data)
	lookups := 0
	for c := range cycles {
		target := minTarget + rng.IntN(maxTarget-minTarget+1)
		t0 := time.Now()
		ws := writeUntil(t, n, w, o, target, n.kill)
		if t.Failed() {
			t.FailNow()
		}
		t1 := time.Now()
		n = startNode(t, fmt.Sprintf("node-%d", c+1), cfg, "--data", data)
		t2 := time.Now()
		rs := resolve(t, n, w, o, rng, 10)
		verify(t, n, o, fmt.Sprintf("after crash %d", c+1))
		lookups += rs.idLookups
		t.Logf("cycle %d: killed after %d acked batches, %d unknown; replayed %d records; "+
			"logins resent: %d new, %d already applied; clicks unacked: %d applied, %d not; %d acked resent as duplicates (%d ids looked up in the index); "+
			"writing %v, restart %v, resolve+verify %v",
			c, ws.acked, ws.unknown, n.recoveredRecords(), rs.resentNew, rs.resentDup, rs.clicksApplied, rs.clicksDropped, rs.sampledDups, rs.idLookups,
			t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), time.Since(t2).Round(time.Millisecond))
	}
	// The duplicates resent after a restart went through the index: the
	// snapshots the keys were restored from hold fingerprints, not ids.
	if lookups == 0 {
		t.Error("no resent id was looked up in the store's id index")
	}
}

// TestSIGTERMDrains terminates a node while writers are sending: it must
// exit 0 promptly, keep every acked batch, and, having checkpointed on the
// way out, replay nothing at the next start.
func TestSIGTERMDrains(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	writers, target := 3, 30
	if testing.Short() {
		writers, target = 2, 15
	}
	// A checkpoint interval longer than the test, so that only the drain's
	// final checkpoint can make the replay empty.
	cfg := writeConfig(t, "checkpoint_interval: 10m\n"+pipelinesYAML)
	data := t.TempDir()
	w := newWorkload(seed, writers, 200, 40, 20, 100)
	o := newOracle()

	n := startNode(t, "node-0", cfg, "--data", data)
	var (
		code int
		took time.Duration
	)
	ws := writeUntil(t, n, w, o, target, func() { code, took = n.terminate(15 * time.Second) })
	t.Logf("SIGTERM after %d acked batches: exit %d after %v; %d batches acked after the signal, %d failed",
		ws.acked-ws.ackedAfter, code, took.Round(time.Millisecond), ws.ackedAfter, ws.unknown)
	for _, f := range ws.failures {
		t.Logf("failed while draining: %s", f)
	}
	if code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0:\n%s", code, n.logs.tail(30))
	}
	if took > 10*time.Second {
		t.Errorf("draining took %v, want a few seconds", took)
	}
	if len(n.logs.grep("msg=stopped")) == 0 {
		t.Errorf("no msg=stopped in the log of a clean drain:\n%s", n.logs.tail(20))
	}
	if errs := n.logs.grep("level=ERROR"); len(errs) > 0 {
		t.Errorf("errors logged during the drain:\n%s", strings.Join(errs, "\n"))
	}

	n = startNode(t, "node-1", cfg, "--data", data)
	if r := n.recoveredRecords(); r != 0 {
		t.Errorf("restart after a clean drain replayed %d records, want 0", r)
	}
	// Everything acked must be there before anything is resent. Keys may
	// hold more (unacked batches that were applied), never less; resolving
	// below tells exactly.
	acked := o.clone()
	obs := observe(t, n, acked)
	for k, want := range acked.keys {
		if got := obs[k]; got.r.Seq < uint64(want.n) {
			t.Errorf("after the drain %s/%s has seq %d (found: %v), but %d events of it were acked", k.pipeline, k.key, got.r.Seq, got.found, want.n)
		}
	}
	rs := resolve(t, n, w, o, rng, 10)
	t.Logf("restart: %s", n.logs.find(regexp.MustCompile(`msg=recovered .*`))[0])
	t.Logf("after restart: logins resent: %d new, %d already applied; clicks unacked: %d applied, %d not",
		rs.resentNew, rs.resentDup, rs.clicksApplied, rs.clicksDropped)
	verify(t, n, o, "after the drain")

	if code, took := n.terminate(15 * time.Second); code != 0 {
		t.Fatalf("idle node: exit code %d after SIGTERM (took %v), want 0", code, took)
	}
}

// TestKillDuringLargeBatch kills a node while it handles one large batch:
// after a restart the batch is applied entirely or not at all, and resending
// it applies it exactly once.
func TestKillDuringLargeBatch(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	events, keys, rounds := 20000, 1000, 4
	if testing.Short() {
		events, keys, rounds = 4000, 200, 2
	}
	cfg := writeConfig(t, "checkpoint_interval: 100ms\n"+pipelinesYAML)
	data := t.TempDir()
	o := newOracle()

	large := func(name string) *batch {
		b := &batch{name: name, pipeline: "logins"}
		for i := range events {
			b.events = append(b.events, event{
				key:    fmt.Sprintf("big%04d", i%keys),
				id:     fmt.Sprintf("%s-e%d", name, i),
				failed: rng.IntN(4) == 0,
				amount: 1 + rng.Int64N(1_000_000),
			})
		}
		b.encode(false)
		return b
	}

	type result struct {
		r   ingestReply
		err error
	}
	// send posts b in the background; sent is closed once the request is
	// written, done gets the outcome.
	send := func(n *node, b *batch) (sent <-chan struct{}, done <-chan result) {
		wrote, out := make(chan struct{}), make(chan result, 1)
		var once sync.Once
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(wrote) }) },
		})
		go func() {
			r, _, err := n.post(ctx, b)
			out <- result{r, err}
		}()
		return wrote, out
	}

	n := startNode(t, "node-0", cfg, "--data", data)
	// Two batches give the keys a history; the second measures how long
	// the node takes from having read a batch to answering, to place the
	// kills within that time.
	var (
		latency time.Duration
		size    int
	)
	for i := range 2 {
		b := large(fmt.Sprintf("calibrate%d", i))
		sent, done := send(n, b)
		<-sent
		start := time.Now()
		res := <-done
		latency, size = time.Since(start), len(b.body)
		if res.err != nil || res.r.Accepted != events {
			t.Fatalf("batch %s: %+v, %v", b.name, res.r, res.err)
		}
		o.add(b)
	}
	t.Logf("a batch of %d events (%d KiB) takes %v from written to answered", events, size>>10, latency.Round(time.Millisecond))

	var applied, notApplied int
	for round := range rounds {
		b := large(fmt.Sprintf("round%d", round))
		o.touch(b)
		sent, done := send(n, b)
		select {
		case <-sent:
		case res := <-done:
			t.Fatalf("round %d: the request ended before it was written: %+v", round, res)
		}
		// Fault injection, not synchronisation: the kill lands at a random
		// moment of the node's handling of the batch, which takes about
		// latency (or just after the answer if the node was quicker). Round
		// r draws from the r-th of rounds equal slices of that time, so the
		// kills cover decoding, the log append and the apply.
		slice := int64(latency) / int64(rounds)
		delay := time.Duration(int64(round)*slice + rng.Int64N(slice+1))
		var res result
		acked := false
		select {
		case <-time.After(delay):
		case res = <-done:
			acked = res.err == nil
		}
		n.kill()
		if !acked {
			res = <-done
			acked = res.err == nil
		}
		if acked && res.r.Accepted != events {
			t.Fatalf("round %d: acked with %+v, want %d accepted", round, res.r, events)
		}

		n = startNode(t, fmt.Sprintf("node-%d", round+1), cfg, "--data", data)
		with := o.clone()
		with.add(b)
		obs := observe(t, n, o)
		dWithout, dWith := diff(o, obs), diff(with, obs)
		switch {
		case len(dWith) == 0:
			applied++
		case acked:
			t.Fatalf("round %d: acked batch not fully present after the crash; %d keys differ:\n  %s",
				round, len(dWith), strings.Join(dWith[:min(25, len(dWith))], "\n  "))
		case len(dWithout) == 0:
			notApplied++
		default:
			t.Fatalf("round %d: batch partly applied after the crash: %d keys differ from all-applied, %d from none-applied:\n  %s",
				round, len(dWith), len(dWithout), strings.Join(dWithout[:min(25, len(dWithout))], "\n  "))
		}
		r := n.mustPost(b)
		if wasApplied := len(dWith) == 0; wasApplied && r.Duplicates != events || !wasApplied && r.Accepted != events {
			t.Fatalf("round %d: resending the batch (applied before: %v) gave %+v", round, wasApplied, r)
		}
		o.add(b)
		verify(t, n, o, fmt.Sprintf("round %d, after resending", round))
		t.Logf("round %d: killed %v after the request was written (acked: %v); replayed %d records; applied before the resend: %v",
			round, delay.Round(time.Millisecond), acked, n.recoveredRecords(), len(dWith) == 0)
	}
	t.Logf("batch applied before the resend in %d of %d rounds", applied, applied+notApplied)
}
