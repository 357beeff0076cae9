package main

import (
	"bytes"
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
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
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
		!strings.Contains(out, `event 2 rejected: field "amount"`) || !strings.Contains(out, `event 4 rejected: field "user_id"`) ||
		!strings.Contains(out, "3 accepted, 0 duplicates, 2 rejected") {
		t.Errorf("send with bad events: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "get", "--addr", base, "logins", "x"); err != nil || !strings.Contains(out, `"amount": 7`) {
		t.Errorf("x after the bad file: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "send", "--addr", base, "nope", nd); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("send to an unknown pipeline: %v", err)
	}
}

func TestBench(t *testing.T) {
	base, grpcAddr := startInProcess(t)
	out, err := runCLI(t, "bench", "--addr", base, "--duration", "300ms", "--keys", "10", "--batch", "5", "--concurrency", "2")
	if err != nil || !strings.Contains(out, "events/s") {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	out, err = runCLI(t, "bench", "--grpc", grpcAddr, "--duration", "300ms", "--keys", "10", "--batch", "5", "--concurrency", "2")
	if err != nil || !strings.Contains(out, "events/s") {
		t.Fatalf("bench --grpc: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "bench", "--addr", base, "--pipeline", "nope", "--duration", "300ms"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("bench against an unknown pipeline: %v", err)
	}
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
	if err := root.ExecuteContext(ctx); err == nil {
		t.Error("a plaintext client got an answer from a TLS node")
	}
	cfg2 := cfg
	cfg2.GRPCTLSKey = ""
	if err := cfg2.Validate(); err == nil {
		t.Error("a certificate without its key validated")
	}
}
