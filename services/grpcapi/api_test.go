package grpcapi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/keyfold/keyfold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services/grpcapi/client"
	"github.com/keyfold/keyfold/services/servicetest"
)

const pipelinesYAML = `
max_body_bytes: 65536
pipelines:
  logins:
    key: user
    id: event_id
    aggregates:
      total:  { op: count }
      amount: { op: sum, field: amount }
      last:   { op: last, field: n }
  clicks:
    key: page
    aggregates:
      hits: { op: count }
`

// startNode runs a real node (embedded store in a temp dir) serving gRPC on
// a loopback port.
func startNode(t *testing.T) *keyfold.Node {
	t.Helper()
	cfg := servicetest.Config(t, pipelinesYAML)
	cfg.GRPCAddr = "127.0.0.1:0"
	return servicetest.Run(t, cfg)
}

func dial(t *testing.T, target string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.Dial(target, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func login(user, id string, amount, n int) []byte {
	return fmt.Appendf(nil, `{"user":%q,"event_id":%q,"amount":%d,"n":%d}`, user, id, amount, n)
}

func wantCode(t *testing.T, what string, err error, code codes.Code) *client.Error {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v (code %s), want %s", what, err, status.Code(err), code)
	}
	var ce *client.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%s: %T is not a *client.Error", what, err)
	}
	if ce.Message == "" || strings.HasPrefix(ce.Message, "actors:") {
		t.Errorf("%s: message %q", what, ce.Message)
	}
	return ce
}

func TestUnaryRPCs(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.GRPCAddr(), client.Options{})
	ctx := t.Context()

	ps, err := c.Pipelines(ctx)
	if err != nil || len(ps) != 2 || ps[0].Name != "clicks" || ps[1].Name != "logins" || ps[1].IdField != "event_id" || len(ps[1].Aggregates) != 3 {
		t.Fatalf("Pipelines = %v, %v", ps, err)
	}

	r, err := c.Ingest(ctx, "logins", [][]byte{login("alice", "e1", 3, 1), login("alice", "e2", 5, 2), login("bob", "e1", 1, 1)})
	if err != nil || r != (client.Result{Accepted: 3}) {
		t.Fatalf("Ingest = %+v, %v", r, err)
	}
	if r, err := c.Ingest(ctx, "logins", [][]byte{login("alice", "e1", 100, 9)}); err != nil || r != (client.Result{Duplicates: 1}) {
		t.Fatalf("retried Ingest = %+v, %v", r, err)
	}
	st, err := c.GetState(ctx, "logins", "alice")
	if err != nil || st.Seq != 2 || st.Aggregates["amount"] != float64(8) || st.Aggregates["last"] != float64(2) || st.Aggregates["total"] != float64(2) {
		t.Fatalf("GetState = %+v, %v", st, err)
	}
	// The same content as the HTTP API's key endpoint.
	hs, err := n.Query(ctx, "logins", "alice")
	gj, _ := json.Marshal(st.Aggregates)
	hj, _ := json.Marshal(hs.Aggregates)
	if err != nil || string(gj) != string(hj) {
		t.Errorf("gRPC state %s, node state %s (%v)", gj, hj, err)
	}

	// Errors.
	_, err = c.Ingest(ctx, "logins", [][]byte{login("carol", "x", 1, 1), []byte(`{"user":"carol","amount":"lots"}`)})
	ce := wantCode(t, "invalid event", err, codes.InvalidArgument)
	if ce.EventIndex != 1 || ce.Field != "amount" {
		t.Errorf("invalid event: index %d field %q, want 1 amount", ce.EventIndex, ce.Field)
	}
	_, err = c.Ingest(ctx, "logins", [][]byte{[]byte(`{"user":`)})
	if ce := wantCode(t, "not JSON", err, codes.InvalidArgument); ce.EventIndex != 0 {
		t.Errorf("not JSON: index %d", ce.EventIndex)
	}
	if _, err := c.GetState(ctx, "logins", "carol"); status.Code(err) != codes.NotFound {
		t.Errorf("the rejected batch left state: %v", err)
	}
	_, err = c.Ingest(ctx, "nope", [][]byte{login("a", "1", 1, 1)})
	wantCode(t, "unknown pipeline", err, codes.NotFound)
	_, err = c.GetState(ctx, "logins", "nobody")
	wantCode(t, "unseen key", err, codes.NotFound)
	big := [][]byte{[]byte(`{"user":"big","pad":"` + strings.Repeat("x", 70000) + `"}`)}
	_, err = c.Ingest(ctx, "logins", big)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("oversized message: %v, want ResourceExhausted", err)
	}
	if r, err := c.Ingest(ctx, "logins", nil); err != nil || r != (client.Result{}) {
		t.Errorf("empty batch: %+v, %v", r, err)
	}

	// Delete.
	if err := c.DeleteKey(ctx, "logins", "alice"); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetState(ctx, "logins", "alice")
	wantCode(t, "deleted key", err, codes.NotFound)
	if err := c.DeleteKey(ctx, "logins", "alice"); err != nil {
		t.Errorf("deleting again: %v", err)
	}
	wantCode(t, "delete empty key", c.DeleteKey(ctx, "logins", ""), codes.InvalidArgument)
	wantCode(t, "delete in unknown pipeline", c.DeleteKey(ctx, "nope", "a"), codes.NotFound)
	if r, err := c.Ingest(ctx, "logins", [][]byte{login("alice", "e1", 7, 3)}); err != nil || r.Accepted != 1 {
		t.Errorf("the deleted key's old id: %+v, %v; want applied afresh", r, err)
	}
}

// TestListPipelines: ListPipelines describes every setting of each
// pipeline, sorted by name, with the defaults filled in (the dedup window,
// the idle timeout and the retention of results; a window that lists no
// aggregates computes all of them) and what does not apply left unset.
func TestListPipelines(t *testing.T) {
	cfg := servicetest.Config(t, servicetest.DescribedYAML)
	cfg.GRPCAddr = "127.0.0.1:0"
	n := servicetest.Run(t, cfg)
	c := dial(t, n.GRPCAddr(), client.Options{})

	got, err := c.Pipelines(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	d := durationpb.New
	want := []*keyfoldv1.PipelineInfo{{
		Name: "clicks", KeyField: "page",
		Aggregates: []*keyfoldv1.AggregateInfo{{Name: "hits", Op: "count"}},
	}, {
		Name: "logins", KeyField: "user_id", IdField: "event_id", TimeField: "ts",
		DedupWindow: d(24 * time.Hour), Ttl: d(720 * time.Hour),
		Aggregates: []*keyfoldv1.AggregateInfo{
			{Name: "amount", Op: "sum", Field: "amount"},
			{Name: "failed", Op: "count", Where: "type == 'login_failed'"},
			{Name: "total", Op: "count"},
		},
		OutOfOrderness: d(5 * time.Second), AllowedLateness: d(time.Minute),
		IdleTimeout: d(30 * time.Second), OutputRetention: d(24 * time.Hour),
		Windows: []*keyfoldv1.WindowInfo{
			{Name: "last_hour", Kind: "sliding", Size: d(time.Hour), Slide: d(5 * time.Minute), Aggregates: []string{"total"}},
			{Name: "per_minute", Kind: "tumbling", Size: d(time.Minute), Aggregates: []string{"total", "amount"}},
			{Name: "sessions", Kind: "session", Gap: d(30 * time.Minute), Aggregates: []string{"amount", "failed", "total"}},
		},
		Patterns: []*keyfoldv1.PatternInfo{
			{Name: "brute_force", Kind: "threshold", Where: "type == 'login_failed'", Count: 3, Within: d(5 * time.Minute)},
			{Name: "fail_then_ok", Kind: "sequence", Sequence: []string{"type == 'login_failed'", "type == 'login_ok'"}, Within: d(10 * time.Minute)},
			{Name: "no_recovery", Kind: "absence", After: "type == 'login_failed'", Absent: "type == 'login_ok'", Within: d(15 * time.Minute)},
		},
	}}
	equalMessages(t, "pipeline", got, want)
}

// equalMessages checks a list of messages against the one expected.
func equalMessages[M proto.Message](t *testing.T, what string, got, want []M) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d %ss, want %d: %v", len(got), what, len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("%s %d:\n got %v\nwant %v", what, i, prototext.Format(got[i]), prototext.Format(want[i]))
		}
	}
}

// TestListJoins: ListPipelines lists the joins after the pipelines, each
// with its kind, mode and two sides, the bounds of its kind and its
// event-time settings with the defaults filled in, what its kind does not
// take left unset.
func TestListJoins(t *testing.T) {
	cfg := servicetest.Config(t, servicetest.JoinsYAML)
	cfg.GRPCAddr = "127.0.0.1:0"
	n := servicetest.Run(t, cfg)
	c := dial(t, n.GRPCAddr(), client.Options{})

	pipelines, err := c.Pipelines(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(pipelines) != 2 || pipelines[0].Name != "orders" || pipelines[1].Name != "payments" {
		t.Errorf("pipelines %v, want orders and payments (the joins are listed apart)", pipelines)
	}
	got, err := c.Joins(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	d := durationpb.New
	side := func(p string, fields ...string) *keyfoldv1.JoinSideInfo {
		return &keyfoldv1.JoinSideInfo{Pipeline: p, Fields: fields}
	}
	want := []*keyfoldv1.JoinInfo{{
		Name: "paid", Kind: "interval", Mode: "left", Left: side("orders", "amount"), Right: side("payments", "amount", "method"),
		Lower: d(0), Upper: d(time.Hour),
		OutOfOrderness: d(0), AllowedLateness: d(time.Minute), IdleTimeout: d(30 * time.Second), OutputRetention: d(24 * time.Hour),
	}, {
		Name: "per_hour", Kind: "window", Mode: "inner", Left: side("orders"), Right: side("payments"),
		Window: "sliding", Size: d(time.Hour), Slide: d(15 * time.Minute),
		OutOfOrderness: d(0), AllowedLateness: d(0), IdleTimeout: d(30 * time.Second), OutputRetention: d(24 * time.Hour),
	}, {
		Name: "rated", Kind: "temporal", Mode: "inner", Left: side("payments"), Right: side("orders", "amount"),
		OutOfOrderness: d(0), IdleTimeout: d(time.Minute), OutputRetention: d(24 * time.Hour),
	}, {
		Name: "sessions", Kind: "window", Mode: "outer", Left: side("orders"), Right: side("payments"),
		Window: "session", Gap: d(10 * time.Minute),
		OutOfOrderness: d(5 * time.Second), AllowedLateness: d(0), IdleTimeout: d(30 * time.Second), OutputRetention: d(24 * time.Hour),
	}}
	equalMessages(t, "join", got, want)
}

// TestIngestStream: batches are applied and acknowledged in the order sent
// (the last value seen by a key is its last batch's), a bad batch gets its
// own error ack without ending the stream, and a window smaller than the
// batches in flight holds the sender back.
func TestIngestStream(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.GRPCAddr(), client.Options{})
	st, err := c.Stream(t.Context(), "logins", 4)
	if err != nil {
		t.Fatal(err)
	}
	const batches = 200
	var (
		mu   sync.Mutex
		acks []int
		errs = map[int]*client.Error{}
	)
	for b := range batches {
		events := [][]byte{login("dora", fmt.Sprintf("b%d-0", b), 1, b), login("emil", fmt.Sprintf("b%d-1", b), 2, b)}
		if b == 50 {
			events = append(events, []byte(`{"amount":1}`)) // no key
		}
		err := st.Send(events, func(r client.Result, err error) {
			mu.Lock()
			defer mu.Unlock()
			acks = append(acks, b)
			if err != nil {
				errs[b], _ = err.(*client.Error)
				return
			}
			if r.Accepted != 2 {
				t.Errorf("batch %d: %+v", b, r)
			}
		})
		if err != nil {
			t.Fatalf("Send %d: %v", b, err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if len(acks) != batches {
		t.Fatalf("%d acks for %d batches", len(acks), batches)
	}
	for i, b := range acks {
		if i != b {
			t.Fatalf("acks out of order: %v…", acks[:i+1])
		}
	}
	if e := errs[50]; len(errs) != 1 || e == nil || e.Code != codes.InvalidArgument || e.EventIndex != 2 || e.Field != "user" {
		t.Errorf("errors %v, want batch 50: InvalidArgument, event 2, field user", errs)
	}
	s, err := c.GetState(t.Context(), "logins", "dora")
	if err != nil || s.Seq != batches-1 || s.Aggregates["last"] != float64(batches-1) {
		t.Errorf("dora = %+v, %v; want %d events, the last one last", s, err, batches-1)
	}
}

// TestHealthAndReflection: the standard health service says SERVING once
// the node is ready, and reflection lists the API (what grpcurl and
// grpc-health-probe use).
func TestHealthAndReflection(t *testing.T) {
	n := startNode(t)
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, svc := range []string{"", "keyfold.v1.Keyfold"} {
		resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v", svc, resp, err)
		}
	}
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "keyfold.v1.Keyfold") {
		t.Errorf("reflection lists %v", names)
	}
}

// proxy forwards TCP connections to target. While holding, it forwards
// nothing from the server to the client; cut closes every connection.
type proxy struct {
	ln      net.Listener
	target  string
	holding atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go io.Copy(s, c)
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && !p.holding.Load() {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestRetryAfterDroppedConnection: the connection drops after the node has
// logged a batch but before its answer arrives; the client retries on a
// new connection, and the batch counts once.
func TestRetryAfterDroppedConnection(t *testing.T) {
	n := startNode(t)
	p := startProxy(t, n.GRPCAddr())
	c := dial(t, p.ln.Addr().String(), client.Options{MaxRetries: 10})
	ctx := t.Context()
	if _, err := c.Pipelines(ctx); err != nil { // connect
		t.Fatal(err)
	}
	events := [][]byte{login("fred", "f1", 10, 1), login("fred", "f2", 20, 2), login("gina", "g1", 1, 1)}
	p.holding.Store(true)
	before := n.Stats().Events
	type out struct {
		r   client.Result
		err error
	}
	res := make(chan out, 1)
	go func() {
		r, err := c.Ingest(ctx, "logins", events)
		res <- out{r, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for n.Stats().Events < before+3 {
		if time.Now().After(deadline) {
			t.Fatal("the node never applied the batch")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.holding.Store(false)
	p.cut() // the answer is lost with the connection
	o := <-res
	if o.err != nil {
		t.Fatalf("Ingest after a dropped connection: %v", o.err)
	}
	if o.r != (client.Result{Duplicates: 3}) {
		t.Errorf("the retry got %+v, want 3 duplicates (the first attempt was applied)", o.r)
	}
	s, err := c.GetState(ctx, "logins", "fred")
	if err != nil || s.Seq != 2 || s.Aggregates["amount"] != float64(30) {
		t.Errorf("fred = %+v, %v; want each event once", s, err)
	}
}

// TestClientSend: Send streams a sequence in batches and returns once all
// is durable; a rejected event is reported and skipped (or, without
// OnRejected, fails Send).
func TestClientSend(t *testing.T) {
	n := startNode(t)
	c := dial(t, n.GRPCAddr(), client.Options{})
	seq := func(count, bad int) func(func([]byte, error) bool) {
		return func(yield func([]byte, error) bool) {
			for i := range count {
				ev := login(fmt.Sprint("s", i%7), fmt.Sprint("sid", i), 1, i)
				if i == bad {
					ev = []byte(`{"user":"s0","amount":[]}`)
				}
				if !yield(ev, nil) {
					return
				}
			}
		}
	}
	var rejected []int
	acked := 0
	sum, err := c.Send(t.Context(), "logins", seq(1000, 321), client.SendOptions{Batch: 50, Window: 3,
		OnRejected: func(i int, err *client.Error) { rejected = append(rejected, i) },
		OnAcked:    func(n int, _ client.Result) { acked += n },
	})
	if err != nil || sum != (client.Summary{Sent: 1000, Accepted: 999, Rejected: 1}) || acked != 999 || fmt.Sprint(rejected) != "[321]" {
		t.Fatalf("Send = %+v, %v; acked %d, rejected %v", sum, err, acked, rejected)
	}
	total := uint64(0)
	for k := range 7 {
		st, err := c.GetState(t.Context(), "logins", fmt.Sprint("s", k))
		if err != nil {
			t.Fatal(err)
		}
		total += st.Seq
	}
	if total != 999 {
		t.Errorf("keys hold %d events, want 999", total)
	}
	// Again: all duplicates. Without OnRejected the bad event fails Send.
	sum, err = c.Send(t.Context(), "logins", seq(1000, -1), client.SendOptions{})
	if err != nil || sum.Duplicates != 999 || sum.Accepted != 1 {
		t.Errorf("resend = %+v, %v", sum, err)
	}
	if _, err := c.Send(t.Context(), "logins", seq(100, 5), client.SendOptions{Batch: 10}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Send with a bad event and no OnRejected = %v", err)
	}
}
