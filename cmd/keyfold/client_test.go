package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
	"github.com/keyfold/keyfold/services/servicetest"
)

// startInProcess runs a node in this process and returns its HTTP base URL
// and gRPC address.
func startInProcess(t *testing.T) (string, string) {
	t.Helper()
	cfg := servicetest.Config(t, `
pipelines:
  logins:
    key: user_id
    id: event_id
    aggregates:
      total:  { op: count }
      amount: { op: sum, field: amount }
`)
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.KeyGroups = "127.0.0.1:0", "127.0.0.1:0", 8
	cfg.CheckpointInterval = time.Second // bench --preload waits for a checkpoint
	n := servicetest.Run(t, cfg)
	return "http://" + n.HTTPAddr(), n.GRPCAddr()
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String() + errOut.String(), err
}

func TestSendAndGet(t *testing.T) {
	_, base := startInProcess(t)
	dir := t.TempDir()

	var ndjson, array strings.Builder
	array.WriteString("[\n")
	for i := range 1200 {
		fmt.Fprintf(&ndjson, `{"user_id":"u%d","event_id":"n%d","amount":1}`+"\n", i%3, i)
		if i > 0 {
			array.WriteString(",\n")
		}
		fmt.Fprintf(&array, `  {"user_id":"u%d","event_id":"a%d","amount":2}`, i%3, i)
	}
	array.WriteString("\n]\n")
	nd, arr := filepath.Join(dir, "events.ndjson"), filepath.Join(dir, "events.json")
	if err := os.WriteFile(nd, []byte(ndjson.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(arr, []byte(array.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	out, err := runCLI(t, "send", "--addr", base, "--batch", "100", "logins", nd)
	if err != nil || !strings.Contains(out, "sent 1200 events in") || !strings.Contains(out, "1200 accepted, 0 duplicates, 0 rejected") {
		t.Fatalf("send ndjson: %v\n%s", err, out)
	}
	out, err = runCLI(t, "send", "--addr", base, "--window", "1", "logins", arr)
	if err != nil || !strings.Contains(out, "1200 accepted, 0 duplicates, 0 rejected") {
		t.Fatalf("send array: %v\n%s", err, out)
	}
	// Sending the same file again is safe: every event is a duplicate.
	out, err = runCLI(t, "send", "--addr", base, "-q", "logins", nd)
	if err != nil || out != "" {
		t.Fatalf("send -q again: %v\n%q", err, out)
	}

	out, err = runCLI(t, "get", "--addr", base, "logins", "u0")
	if err != nil {
		t.Fatal(err)
	}
	var st keyfold.KeyState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("get output %q: %v", out, err)
	}
	if st.Seq != 800 || st.Aggregates["amount"] != float64(1200) {
		t.Errorf("u0 = %+v, want seq 800, amount 1200", st)
	}

	if _, err := runCLI(t, "get", "--addr", base, "logins", "nobody"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("get unknown key: %v", err)
	}

	// Rejected events are reported with their number in the input and
	// skipped; the rest of their batches is applied; the exit is an error.
	bad := filepath.Join(dir, "bad.ndjson")
	os.WriteFile(bad, []byte(`{"user_id":"x","event_id":"b1","amount":1}
{"user_id":"x","event_id":"b2","amount":"lots"}
{"user_id":"x","event_id":"b3","amount":2}
{"event_id":"b4","amount":2}
{"user_id":"x","event_id":"b5","amount":4}
`), 0o600)
	out, err = runCLI(t, "send", "--addr", base, "--batch", "3", "logins", bad)
	if err == nil || !strings.Contains(err.Error(), "2 events rejected") ||
		!strings.Contains(out, `line 2 rejected: field "amount"`) || !strings.Contains(out, `line 4 rejected: field "user_id"`) ||
		!strings.Contains(out, "3 accepted, 0 duplicates, 2 rejected") {
		t.Errorf("send with bad events: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "get", "--addr", base, "logins", "x"); err != nil || !strings.Contains(out, `"amount": 7`) {
		t.Errorf("x after the bad file: %v\n%s", err, out)
	}

	// A line that is not JSON in the middle of a file: what came before it
	// is sent and acknowledged, the command names the line and prints the
	// summary; with --skip-malformed it goes on past the line. Rejects
	// after blank lines are named by their line, not their event number.
	var mixed strings.Builder
	for i := range 1200 {
		if i == 1000 {
			mixed.WriteString("{\"user_id\":\"m\",\"event_id\":\n")
		}
		if i == 1100 {
			mixed.WriteString("\n\n")
		}
		if i == 1150 {
			mixed.WriteString(`{"user_id":"m","event_id":"bad","amount":"x"}` + "\n")
		}
		fmt.Fprintf(&mixed, `{"user_id":"m","event_id":"m%d","amount":1}`+"\n", i)
	}
	mf := filepath.Join(dir, "mixed.ndjson")
	os.WriteFile(mf, []byte(mixed.String()), 0o600)
	out, err = runCLI(t, "send", "--addr", base, "--batch", "300", "-q", "logins", mf)
	if err == nil || !strings.Contains(err.Error(), "line 1001: malformed JSON") ||
		!strings.Contains(out, "sent 1000 events in") || !strings.Contains(out, "1000 accepted, 0 duplicates, 0 rejected, 0 malformed") {
		t.Errorf("send stopping at a malformed line: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "get", "--addr", base, "logins", "m"); err != nil || !strings.Contains(out, `"amount": 1000`) {
		t.Errorf("m after stopping at line 1001: %v\n%s", err, out)
	}
	out, err = runCLI(t, "send", "--addr", base, "--batch", "300", "--skip-malformed", "logins", mf)
	if err == nil || !strings.Contains(err.Error(), "1 events rejected, 1 lines malformed") ||
		!strings.Contains(out, "line 1001: malformed JSON") || !strings.Contains(out, `line 1154 rejected: field "amount"`) ||
		!strings.Contains(out, "200 accepted, 1000 duplicates, 1 rejected, 1 malformed") {
		t.Errorf("send --skip-malformed: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "get", "--addr", base, "logins", "m"); err != nil || !strings.Contains(out, `"amount": 1200`) {
		t.Errorf("m after --skip-malformed: %v\n%s", err, out)
	}

	if _, err := runCLI(t, "send", "--addr", base, "nope", nd); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("send to an unknown pipeline: %v", err)
	}
}

func TestBench(t *testing.T) {
	base, grpcAddr := startInProcess(t)
	out, err := runCLI(t, "bench", "--http", base, "--duration", "300ms", "--keys", "10", "--batch", "5", "--concurrency", "2")
	if err != nil || !strings.Contains(out, "events/s") {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	out, err = runCLI(t, "bench", "--addr", grpcAddr, "--duration", "300ms", "--keys", "10", "--batch", "5", "--concurrency", "2")
	if err != nil || !strings.Contains(out, "events/s") {
		t.Fatalf("bench --grpc: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "bench", "--http", base, "--pipeline", "nope", "--duration", "300ms"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("bench against an unknown pipeline: %v", err)
	}

	// The state-at-scale comparison's modes: a stream with a window, Zipf
	// keys, a preload of every key (and, with --metrics, a wait for the
	// node to checkpoint it), memory figures, JSON; every key the preload
	// sent exists afterwards.
	out, err = runCLI(t, "bench", "--addr", grpcAddr, "--stream", "--window", "4", "--dist", "zipf", "--keys", "50",
		"--preload", "--duration", "300ms", "--batch", "10", "--concurrency", "2", "--metrics", base, "--json")
	var res benchResult
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Target != "keyfold-grpc-stream" || res.Events == 0 || res.NodeActiveKeys == 0 || res.NodeRSS == 0 || res.SettledS == 0 {
		t.Fatalf("bench --stream --json: %v\n%s", err, out)
	}
	// The CPU per event of the node (here the test's own process) and of
	// the load generator; no Redis was named.
	if res.ClientCPU <= 0 || res.NodeCPU <= 0 || res.RedisCPU != 0 {
		t.Errorf("bench --metrics: cpu per event node %v, client %v, redis %v µs", res.NodeCPU, res.ClientCPU, res.RedisCPU)
	}
	for _, k := range []string{"u0", "u49"} {
		if out, err := runCLI(t, "get", "--addr", grpcAddr, "logins", k); err != nil {
			t.Errorf("key %s after --preload: %v\n%s", k, err, out)
		}
	}

	// A warm-up of a number of events sends exactly that many (not a
	// batch's worth more per client), and the result says how many were
	// acknowledged; a negative number is refused.
	out, err = runCLI(t, "bench", "--addr", grpcAddr, "--stream", "--keys", "50", "--warmup-events", "37",
		"--duration", "200ms", "--batch", "10", "--concurrency", "2", "--json")
	res = benchResult{}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.WarmupEvents != 37 || res.WarmupS <= 0 || res.Events == 0 {
		t.Fatalf("bench --warmup-events 37: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "bench", "--addr", grpcAddr, "--warmup-events", "-1", "--duration", "200ms"); err == nil || !strings.Contains(err.Error(), "--warmup-events") {
		t.Errorf("bench --warmup-events -1: %v", err)
	}

	// An offered rate: the clients send on a schedule, so no more than the
	// rate's events go out (a batch's worth of slack per client), and the
	// result says what was offered. A rate that is not one is refused.
	// --trace writes one line per acknowledged batch: when it was due, on
	// the schedule, and its latency.
	trace := filepath.Join(t.TempDir(), "trace.txt")
	out, err = runCLI(t, "bench", "--addr", grpcAddr, "--stream", "--rate", "500", "--keys", "50",
		"--duration", "1s", "--batch", "10", "--concurrency", "2", "--json", "--trace", trace)
	res = benchResult{}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Rate != 500 || res.Events == 0 || res.Events > 500+2*10 {
		t.Fatalf("bench --rate 500 for 1s: %v\n%s", err, out)
	}
	lines, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	acks := strings.Split(strings.TrimSpace(string(lines)), "\n")
	if len(acks) != res.Requests+1 || !strings.HasPrefix(acks[0], "# begin ") {
		t.Fatalf("trace of %d requests: %d lines, starting %q", res.Requests, len(acks), acks[0])
	}
	for i, l := range acks[1:] {
		var due, lat int64
		if _, err := fmt.Sscanf(l, "%d %d", &due, &lat); err != nil || due < 0 || due > 1000 || lat < 0 {
			t.Fatalf("trace line %d %q: %v", i+1, l, err)
		}
	}
	// --cpu-profile: the node's CPU profile of the measured phase, fetched
	// from its pprof address (here this process's): a gzipped pprof profile
	// of CPU samples. Half of the pair is refused.
	paddr, stopPprof, err := servePprof("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stopPprof()
	prof := filepath.Join(t.TempDir(), "cpu.pprof")
	if out, err := runCLI(t, "bench", "--addr", grpcAddr, "--stream", "--keys", "50", "--duration", "1s", "--batch", "10",
		"--concurrency", "2", "--pprof", paddr, "--cpu-profile", prof); err != nil {
		t.Fatalf("bench --cpu-profile: %v\n%s", err, out)
	}
	if raw, err := gunzipFile(prof); err != nil || !bytes.Contains(raw, []byte("cpu")) || !bytes.Contains(raw, []byte("nanoseconds")) {
		t.Errorf("bench --cpu-profile wrote no CPU profile: %v (%d bytes)", err, len(raw))
	}
	if _, err := runCLI(t, "bench", "--addr", grpcAddr, "--cpu-profile", prof); err == nil || !strings.Contains(err.Error(), "--pprof") {
		t.Errorf("bench --cpu-profile without --pprof: %v, want a refusal naming --pprof", err)
	}

	for _, bad := range []string{"-1", "NaN", "+Inf"} {
		if _, err := runCLI(t, "bench", "--addr", grpcAddr, "--rate", bad); err == nil || !strings.Contains(err.Error(), "--rate") {
			t.Errorf("bench --rate %s: %v, want a refusal naming --rate", bad, err)
		}
	}

	// The hand-written Redis design it is compared with, on a real Redis:
	// every event counted once per key, ids remembered.
	rs := redistest.Start(t)
	out, err = runCLI(t, "bench", "--naive-redis", rs.URL(), "--stream", "--keys", "7", "--preload", "--duration", "300ms",
		"--batch", "10", "--concurrency", "2", "--redis-info", rs.URL(), "--json")
	res = benchResult{}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Target != "naive-redis" || res.RedisUsed == 0 {
		t.Fatalf("bench --naive-redis: %v\n%s", err, out)
	}
	if res.RedisCPU <= 0 || res.ClientCPU <= 0 || res.NodeCPU != 0 {
		t.Errorf("bench --redis-info: cpu per event redis %v, client %v, node %v µs", res.RedisCPU, res.ClientCPU, res.NodeCPU)
	}
	rdb := rs.Client()
	total, ids := int64(0), 0
	for k := range 7 {
		n, err := rdb.HGet(t.Context(), fmt.Sprintf("naive:logins:u%d", k), "total").Int64()
		if err != nil {
			t.Fatalf("naive key u%d: %v", k, err)
		}
		total += n
	}
	iter := rdb.Scan(t.Context(), 0, "naive:logins:*:id:*", 1000).Iterator()
	for iter.Next(t.Context()) {
		ids++
	}
	if int64(ids) != total || total < res.Events+7 {
		t.Errorf("naive Redis: %d events counted, %d ids remembered; want them equal and at least the %d measured + 7 preloaded", total, ids, res.Events)
	}
}

// gunzipFile returns the decompressed content of a gzip file.
func gunzipFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(z)
}

// selfSigned writes a certificate for 127.0.0.1 and its key as PEM files.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "keyfold test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

// bench --preload waits for the node to store what it preloaded: it returns
// once keyfold_dirty_keys is 0 (not before), and refuses a node without
// the metric (it could not tell) or one that does not get there in time.
func TestBenchWaitsForThePreloadsCheckpoint(t *testing.T) {
	base, grpcAddr := startInProcess(t)
	nd := filepath.Join(t.TempDir(), "events.ndjson")
	var events strings.Builder
	for i := range 500 {
		fmt.Fprintf(&events, `{"user_id":"w%d","event_id":"w%d","amount":1}`+"\n", i, i)
	}
	if err := os.WriteFile(nd, []byte(events.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, "send", "--addr", grpcAddr, "-q", "logins", nd); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	ctx := context.Background()
	if err := waitCheckpointed(ctx, base, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if v, err := scrapeMetrics(ctx, base, "keyfold_dirty_keys"); err != nil || v[0] != 0 {
		t.Fatalf("after the wait: %v changed keys (%v), want 0", v, err)
	}

	serve := func(body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(s.Close)
		return s.URL
	}
	if err := waitCheckpointed(ctx, serve("keyfold_active_keys 3\n"), time.Second); err == nil || !strings.Contains(err.Error(), "no keyfold_dirty_keys") {
		t.Errorf("a node without the metric: %v", err)
	}
	if err := waitCheckpointed(ctx, serve("keyfold_dirty_keys 5\n"), 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "5 changed keys") || !strings.Contains(err.Error(), "--preload-timeout") {
		t.Errorf("a node that keeps changed keys: %v", err)
	}
	if _, err := runCLI(t, "bench", "--addr", grpcAddr, "--preload", "--preload-timeout", "0s", "--duration", "1s"); err == nil || !strings.Contains(err.Error(), "--preload-timeout") {
		t.Errorf("bench --preload-timeout 0s: %v", err)
	}
}

// TestGRPCTLS: a node serving gRPC over TLS is reached by send and get with
// --tls-ca, and refuses a plaintext client.
func TestGRPCTLS(t *testing.T) {
	cert, key := selfSigned(t)
	cfg := servicetest.Config(t, "pipelines:\n  logins:\n    key: user_id\n    id: event_id\n    aggregates:\n      total: { op: count }\n")
	cfg.GRPCAddr, cfg.GRPCTLSCert, cfg.GRPCTLSKey = "127.0.0.1:0", cert, key
	n := servicetest.Run(t, cfg)
	in := filepath.Join(t.TempDir(), "e.ndjson")
	os.WriteFile(in, []byte(`{"user_id":"tls","event_id":"1"}`+"\n"), 0o600)
	if out, err := runCLI(t, "send", "--addr", n.GRPCAddr(), "--tls-ca", cert, "logins", in); err != nil || !strings.Contains(out, "1 accepted") {
		t.Fatalf("send over TLS: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "get", "--addr", n.GRPCAddr(), "--tls-ca", cert, "logins", "tls"); err != nil || !strings.Contains(out, `"seq": 1`) {
		t.Fatalf("get over TLS: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	root := newRoot()
	root.SetArgs([]string{"get", "--addr", n.GRPCAddr(), "logins", "tls"})
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	if err := root.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), "--tls") {
		t.Errorf("a plaintext client of a TLS node: %v, want an error that says to use --tls", err)
	}
	cfg2 := cfg
	cfg2.GRPCTLSKey = ""
	if err := cfg2.Validate(); err == nil {
		t.Error("a certificate without its key validated")
	}
}

// pollUntil checks cond every 20 ms until it holds; the test fails if
// timeout passes first.
func pollUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockedBuffer is a bytes.Buffer a running command writes to while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// parseOutputs reads the NDJSON that `keyfold outputs` prints.
func parseOutputs(t *testing.T, ndjson string) []keyfold.Output {
	t.Helper()
	var outs []keyfold.Output
	for line := range strings.Lines(ndjson) {
		var o keyfold.Output
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("outputs line %q: %v", line, err)
		}
		outs = append(outs, o)
	}
	return outs
}

// TestOutputs: `keyfold outputs` prints a pipeline's window results as
// NDJSON, from a cursor and up to a limit, and --follow prints them as they
// are stored until interrupted.
func TestOutputs(t *testing.T) {
	// A 1 s tumbling window on ingest time: no time field, so the watermark
	// is the node's clock and a window's result is stored within about two
	// seconds. (The window is set in Go, so that this test does not depend
	// on ParseConfig reading windows:, which the keyfold package tests.)
	cfg := servicetest.Config(t, `
pipelines:
  clicks:
    key: page
    id: id
    aggregates:
      n:     { op: count }
      total: { op: sum, field: amount }
`)
	p := cfg.Pipelines["clicks"]
	p.Windows = map[string]fold.WindowSpec{"second": {Type: "tumbling", Size: time.Second}}
	cfg.Pipelines["clicks"] = p
	cfg.GRPCAddr = "127.0.0.1:0"
	addr := servicetest.Run(t, cfg).GRPCAddr()

	// Follow from the start, before anything is stored.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var followed lockedBuffer
	follow := newRoot()
	follow.SetArgs([]string{"outputs", "--addr", addr, "--follow", "clicks"})
	follow.SetOut(&followed)
	follow.SetErr(&followed)
	followDone := make(chan error, 1)
	go func() { followDone <- follow.ExecuteContext(ctx) }()

	in := filepath.Join(t.TempDir(), "clicks.ndjson")
	os.WriteFile(in, []byte(`{"page":"home","id":"1","amount":2}
{"page":"home","id":"2","amount":3}
{"page":"cart","id":"3","amount":10}
{"page":"about","id":"4","amount":1}
`), 0o600)
	if out, err := runCLI(t, "send", "--addr", addr, "clicks", in); err != nil || !strings.Contains(out, "4 accepted") {
		t.Fatalf("send: %v\n%s", err, out)
	}

	var all []keyfold.Output
	pollUntil(t, 15*time.Second, "three window results", func() bool {
		out, err := runCLI(t, "outputs", "--addr", addr, "clicks")
		if err != nil {
			t.Fatalf("outputs: %v\n%s", err, out)
		}
		all = parseOutputs(t, out)
		return len(all) >= 3
	})
	type result struct {
		count  uint64
		values string
	}
	want := map[string]result{"home": {2, `{"n":2,"total":5}`}, "cart": {1, `{"n":1,"total":10}`}, "about": {1, `{"n":1,"total":1}`}}
	for _, o := range all {
		if o.Cursor == "" || o.ID == "" || o.Pipeline != "clicks" || o.Kind != "tumbling" || o.Name != "second" ||
			o.End.Sub(o.Start) != time.Second || o.Stored.IsZero() || o.Watermark.Before(o.End) {
			t.Errorf("output %+v", o)
		}
		if w, ok := want[o.Key]; !ok || o.Count != w.count || string(o.Values) != w.values {
			t.Errorf("output of %q: count %d, values %s; want %+v", o.Key, o.Count, o.Values, w)
		}
		delete(want, o.Key)
	}
	if len(all) != 3 || len(want) != 0 {
		t.Fatalf("%d outputs, missing %v", len(all), want)
	}

	// From a cursor; up to a limit.
	out, err := runCLI(t, "outputs", "--addr", addr, "--after", all[0].Cursor, "clicks")
	if got := parseOutputs(t, out); err != nil || len(got) != 2 || got[0].ID != all[1].ID || got[1].ID != all[2].ID {
		t.Errorf("outputs --after the first: %v\n%s", err, out)
	}
	out, err = runCLI(t, "outputs", "--addr", addr, "--limit", "1", "clicks")
	if got := parseOutputs(t, out); err != nil || len(got) != 1 || got[0].ID != all[0].ID {
		t.Errorf("outputs --limit 1: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "outputs", "--addr", addr, "--after", all[2].Cursor, "clicks"); err != nil || out != "" {
		t.Errorf("outputs after the last: %v\n%q", err, out)
	}
	// --follow with a limit ends once it printed that many.
	out, err = runCLI(t, "outputs", "--addr", addr, "--follow", "--limit", "2", "--after", all[0].Cursor, "clicks")
	if got := parseOutputs(t, out); err != nil || len(got) != 2 || got[1].Cursor != all[2].Cursor {
		t.Errorf("outputs --follow --limit 2: %v\n%s", err, out)
	}

	// The follower printed the same lines as they were stored; it stops,
	// without an error, when interrupted.
	pollUntil(t, 10*time.Second, "the follower's three lines", func() bool { return strings.Count(followed.String(), "\n") >= 3 })
	if got := parseOutputs(t, followed.String()); len(got) != 3 || got[0].Cursor != all[0].Cursor || got[2].Cursor != all[2].Cursor {
		t.Errorf("outputs --follow printed:\n%s", followed.String())
	}
	cancel()
	select {
	case err := <-followDone:
		if err != nil {
			t.Errorf("outputs --follow, interrupted: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("outputs --follow did not stop 10s after it was interrupted")
	}

	if _, err := runCLI(t, "outputs", "--addr", addr, "nope"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("outputs of an unknown pipeline: %v", err)
	}
	if _, err := runCLI(t, "outputs", "--addr", addr, "--follow", "--after", "not-a-cursor", "clicks"); err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Errorf("outputs --follow after a bad cursor: %v", err)
	}
}

// TestAdminCommands: delete, health (gRPC and HTTP), config check and
// version; --addr is a gRPC host:port in every command, and an HTTP URL
// given to it says where that goes.
func TestAdminCommands(t *testing.T) {
	base, grpcAddr := startInProcess(t)
	if _, err := runCLI(t, "send", "--addr", grpcAddr, "-q", "logins", "../../examples/events.ndjson"); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, "get", "--addr", grpcAddr, "logins", "alice"); err != nil || !strings.Contains(out, `"key": "alice"`) {
		t.Fatalf("get alice: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "delete", "--addr", grpcAddr, "logins", "alice"); err != nil || out != "deleted logins/alice\n" {
		t.Fatalf("delete: %v\n%q", err, out)
	}
	if _, err := runCLI(t, "get", "--addr", grpcAddr, "logins", "alice"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("get after delete: %v", err)
	}

	for _, args := range [][]string{{"--addr", grpcAddr}, {"--http", base}} {
		if out, err := runCLI(t, append([]string{"health"}, args...)...); err != nil || out != "ready\n" {
			t.Errorf("health %v: %v\n%q", args, err, out)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nobody serves on
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if _, err := runCLI(t, "health", "--addr", closed, "--timeout", "300ms"); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("health of nothing: %v", err)
	}
	for _, cmd := range [][]string{{"get", "logins", "alice"}, {"delete", "logins", "alice"}, {"health"}, {"outputs", "logins"}, {"send", "logins", "-"}, {"bench", "--duration", "1s"}} {
		_, err := runCLI(t, append(cmd, "--addr", base)...)
		if err == nil || !strings.Contains(err.Error(), "want the node's gRPC host:port") {
			t.Errorf("%v --addr %s: %v, want a gRPC address error", cmd, base, err)
		}
	}

	good := filepath.Join(t.TempDir(), "good.yaml")
	os.WriteFile(good, []byte("pipelines:\n  b: {key: k}\n  a: {key: k, aggregates: {n: {op: count}}}\n"), 0o600)
	if out, err := runCLI(t, "config", "check", "-c", good); err != nil || !strings.HasSuffix(out, "good.yaml: ok (pipelines: a, b)\n") {
		t.Errorf("config check of a good file: %v\n%q", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("pipelines:\n  a:\n    key: k\n    aggregates:\n      n: {op: nope}\n      m: {op: sum}\n"), 0o600)
	_, err = runCLI(t, "config", "check", "-c", bad)
	if err == nil || !strings.Contains(err.Error(), `unknown op "nope"`) || !strings.Contains(err.Error(), "line 5") || !strings.Contains(err.Error(), "aggregates.m") {
		t.Errorf("config check of a bad file: %v, want both problems with their lines", err)
	}

	out, err := runCLI(t, "version")
	if err != nil || !strings.HasPrefix(out, "keyfold ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("version: %v\n%q", err, out)
	}
}
