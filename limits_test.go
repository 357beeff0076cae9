package keyfold_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/keyfold/keyfold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services"
)

// limitsNode runs a node serving HTTP and gRPC on yaml and returns it with
// a gRPC client.
func limitsNode(t *testing.T, yaml string) (*keyfold.Node, keyfoldv1.KeyfoldClient) {
	t.Helper()
	cfg, err := keyfold.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.DataDir, cfg.KeyGroups = "127.0.0.1:0", "127.0.0.1:0", t.TempDir(), 16
	n := run(t, cfg)
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return n, keyfoldv1.NewKeyfoldClient(conn)
}

func postJSON(t *testing.T, n *keyfold.Node, body string) (int, string) {
	t.Helper()
	return post(t, n, "/v1/pipelines/p/events", "application/json", body)
}

// post POSTs body to path on n's HTTP API; it returns the status and the
// body.
func post(t *testing.T, n *keyfold.Node, path, contentType, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+n.HTTPAddr()+path, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// badRequestField returns the field of err's BadRequest detail.
func badRequestField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 {
			return br.FieldViolations[0].Field
		}
	}
	return ""
}

// TestKeysAndIDsMustBeTextOverBothAPIs: distinct ids that encoding/json
// would both turn into U+FFFD ("\ud800", "\udfff"), and keys of invalid
// UTF-8, are refused over HTTP (400 naming the field) and gRPC
// (InvalidArgument, BadRequest events[i].field), and nothing is applied.
func TestKeysAndIDsMustBeTextOverBothAPIs(t *testing.T) {
	n, c := limitsNode(t, "pipelines:\n  p:\n    key: k\n    id: id\n    aggregates:\n      n: { op: count }\n")
	for _, body := range []string{`[{"k":"a","id":"\ud800"}]`, `[{"k":"a","id":"ok"},{"k":"a","id":"\udfff"}]`} {
		if code, msg := postJSON(t, n, body); code != http.StatusBadRequest || !strings.Contains(msg, `field \"id\"`) || !strings.Contains(msg, "UTF-8") {
			t.Errorf("HTTP %s: %d %s, want 400 naming field id", body, code, msg)
		}
	}
	if code, msg := postJSON(t, n, "[{\"k\":\"\xff\"}]"); code != http.StatusBadRequest || !strings.Contains(msg, `field \"k\"`) {
		t.Errorf("HTTP invalid UTF-8 key: %d %s, want 400 naming field k", code, msg)
	}
	ctx := context.Background()
	for _, ev := range []string{`{"k":"a","id":"\udfff"}`, `{"k":"\ud800x"}`, "{\"k\":\"a\",\"id\":\"\xc3\"}"} {
		_, err := c.Ingest(ctx, &keyfoldv1.IngestRequest{Pipeline: "p", Events: [][]byte{[]byte(`{"k":"a"}`), []byte(ev)}})
		field := "events[1].id"
		if strings.Contains(ev, `"k":"\u`) || strings.Contains(ev, `"k":"\ud`) {
			field = "events[1].k"
		}
		if status.Code(err) != codes.InvalidArgument || badRequestField(err) != field {
			t.Errorf("gRPC %s: %v (field %q), want InvalidArgument on %s", ev, err, badRequestField(err), field)
		}
	}
	if _, err := c.GetState(ctx, &keyfoldv1.GetStateRequest{Pipeline: "p", Key: "a"}); status.Code(err) != codes.NotFound {
		t.Errorf("after refused batches, key a: %v, want NotFound", err)
	}
	// Distinct valid ids stay distinct.
	if code, msg := postJSON(t, n, `[{"k":"a","id":"\ud83d\ude00"},{"k":"a","id":"\ud83d\ude01"},{"k":"a","id":"\ufffd"}]`); code != http.StatusOK || !strings.Contains(msg, `"accepted":3`) {
		t.Errorf("three distinct ids: %d %s", code, msg)
	}
}

// TestBatchLimitsOverBothAPIs: a batch over max_batch_events is refused
// whole, 413 over HTTP and InvalidArgument (not retryable) over gRPC, on a
// unary call and on a stream, where the next batch still goes through.
func TestBatchLimitsOverBothAPIs(t *testing.T) {
	n, c := limitsNode(t, "max_batch_events: 3\npipelines:\n  p:\n    key: k\n    aggregates:\n      n: { op: count }\n")
	four := `[{"k":"a"},{"k":"a"},{"k":"a"},{"k":"a"}]`
	if code, msg := postJSON(t, n, four); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "max_batch_events is 3") {
		t.Errorf("HTTP, 4 events: %d %s, want 413 naming max_batch_events", code, msg)
	}
	ndjson, err := http.Post("http://"+n.HTTPAddr()+"/v1/pipelines/p/events", "application/x-ndjson", strings.NewReader("{\"k\":\"a\"}\n{\"k\":\"a\"}\n\n{\"k\":\"a\"}\n{\"k\":\"a\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ndjson.Body.Close()
	if ndjson.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("HTTP NDJSON, 4 events: %d, want 413", ndjson.StatusCode)
	}
	events := func(k int) [][]byte {
		out := make([][]byte, k)
		for i := range out {
			out[i] = []byte(`{"k":"a"}`)
		}
		return out
	}
	ctx := context.Background()
	if _, err := c.Ingest(ctx, &keyfoldv1.IngestRequest{Pipeline: "p", Events: events(4)}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_batch_events") {
		t.Errorf("gRPC, 4 events: %v, want InvalidArgument naming max_batch_events", err)
	}
	s, err := c.IngestStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id, k := range []int{4, 3} {
		if err := s.Send(&keyfoldv1.IngestStreamRequest{BatchId: uint64(id), Pipeline: "p", Events: events(k)}); err != nil {
			t.Fatal(err)
		}
	}
	s.CloseSend()
	if ack, err := s.Recv(); err != nil || ack.Error == nil || codes.Code(ack.Error.Code) != codes.InvalidArgument {
		t.Errorf("stream batch of 4: %v %v, want an InvalidArgument ack", ack, err)
	}
	if ack, err := s.Recv(); err != nil || ack.Error != nil || ack.Accepted != 3 {
		t.Errorf("stream batch of 3 after it: %v %v, want 3 accepted", ack, err)
	}
	st, err := c.GetState(ctx, &keyfoldv1.GetStateRequest{Pipeline: "p", Key: "a"})
	if err != nil || st.Seq != 3 {
		t.Errorf("state: %v %v, want the 3 events of the accepted batch", st, err)
	}
}

// TestIngestBudgetSharedByBothAPIs: the bytes an HTTP ingest holds while
// its body arrives count against the same max_ingest_bytes as gRPC
// batches: with a slow HTTP body in the budget, a gRPC batch that does not
// fit is ResourceExhausted with a RetryInfo; once the slow client is gone
// it goes through.
func TestIngestBudgetSharedByBothAPIs(t *testing.T) {
	// The smallest budget the config allows: max_body_bytes + 4 events.
	n, c := limitsNode(t, fmt.Sprintf("max_body_bytes: 4096\nmax_batch_events: 4\nmax_ingest_bytes: %d\npipelines:\n  p:\n    key: k\n    aggregates:\n      n: { op: count }\n", 4096+4*services.EventCost))
	conn, err := net.Dial("tcp", n.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/pipelines/p/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\nExpect: 100-continue\r\n\r\n")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(line, " 100 ") {
		t.Fatalf("the slow HTTP body is not being read: %q %v", line, err)
	}
	conn.Write([]byte("[")) // and nothing more for now: it holds its buffer

	pad := strings.Repeat("x", 300)
	batch := make([][]byte, 4) // 4 x (314 + 384) bytes: more than what is left
	for i := range batch {
		batch[i] = []byte(`{"k":"a","p":"` + pad + `"}`)
	}
	ctx := context.Background()
	_, err = c.Ingest(ctx, &keyfoldv1.IngestRequest{Pipeline: "p", Events: batch})
	var retry bool
	for _, d := range status.Convert(err).Details() {
		_, retry = d.(*errdetails.RetryInfo)
	}
	if status.Code(err) != codes.ResourceExhausted || !retry || !strings.Contains(err.Error(), "max_ingest_bytes") {
		t.Fatalf("gRPC batch while an HTTP body holds the budget: %v, want ResourceExhausted with RetryInfo", err)
	}
	conn.Close() // the HTTP request ends, its reservation with it
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := c.Ingest(ctx, &keyfoldv1.IngestRequest{Pipeline: "p", Events: batch})
		if err == nil {
			if resp.Accepted != 4 {
				t.Errorf("accepted %d, want 4", resp.Accepted)
			}
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("gRPC batch once the slow client is gone: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling the outcome, with a deadline
	}
}
