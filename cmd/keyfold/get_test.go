package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/services/servicetest"
)

// TestGetPrintsHTTPShape: `keyfold get` prints exactly what the HTTP API
// answers for the key (indented), for a pipeline with windows and patterns
// too: the watermark, late, windows, late_windows and patterns, in the HTTP
// API's order; and for a pipeline without them, none of those fields.
func TestGetPrintsHTTPShape(t *testing.T) {
	cfg := servicetest.Config(t, `
pipelines:
  plain:
    key: user
    id: id
    aggregates:
      n:   { op: count }
      sum: { op: sum, field: amount }
  timed:
    key: user
    id: id
    time: ts
    out_of_orderness: 0s
    aggregates:
      n:   { op: count }
      sum: { op: sum, field: amount }
    windows:
      minute: { type: tumbling, size: 1m, aggregates: [n, sum] }
    patterns:
      burst: { where: "amount > 5", count: 2, within: 5m }
`)
	cfg.HTTPAddr, cfg.GRPCAddr, cfg.KeyGroups = "127.0.0.1:0", "127.0.0.1:0", 8
	n := servicetest.Run(t, cfg)
	base, grpcAddr := "http://"+n.HTTPAddr(), n.GRPCAddr()

	post := func(pipeline, body string) {
		t.Helper()
		resp, err := http.Post(base+"/v1/pipelines/"+pipeline+"/events", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %s", pipeline, resp.StatusCode, b)
		}
	}
	// Two events in one minute, one late for it (the watermark passed the
	// minute), so every field of the event-time state has a value; and a
	// duplicate.
	t0 := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC).UnixMilli()
	post("timed", fmt.Sprintf(`[{"user":"a","id":"1","ts":%d,"amount":7},{"user":"a","id":"2","ts":%d,"amount":9},{"user":"a","id":"2","ts":%d,"amount":9}]`, t0, t0+1000, t0+1000))
	post("timed", fmt.Sprintf(`[{"user":"a","id":"3","ts":%d,"amount":1},{"user":"a","id":"4","ts":%d,"amount":2}]`, t0+120_000, t0+500))
	post("plain", `[{"user":"b","id":"1","amount":3},{"user":"b","id":"1","amount":3}]`)

	for _, k := range []struct{ pipeline, key string }{{"timed", "a"}, {"plain", "b"}} {
		resp, err := http.Get(base + "/v1/pipelines/" + k.pipeline + "/keys/" + k.key)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s/%s: %d %s", k.pipeline, k.key, resp.StatusCode, body)
		}
		var want bytes.Buffer
		if err := json.Indent(&want, bytes.TrimSpace(body), "", "  "); err != nil {
			t.Fatal(err)
		}
		want.WriteByte('\n')
		got, err := runCLI(t, "get", "--addr", grpcAddr, k.pipeline, k.key)
		if err != nil {
			t.Fatalf("get %s %s: %v\n%s", k.pipeline, k.key, err, got)
		}
		if got != want.String() {
			t.Errorf("get %s %s printed\n%s\nthe HTTP API answers\n%s", k.pipeline, k.key, got, want.String())
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(got), &fields); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"watermark", "late", "windows", "late_windows", "patterns"} {
			if _, ok := fields[f]; ok != (k.pipeline == "timed") {
				t.Errorf("get %s %s: field %q present: %v\n%s", k.pipeline, k.key, f, ok, got)
			}
		}
	}
}
