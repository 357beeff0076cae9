package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// JSON logs carry durations in a readable unit, as text logs do.
func TestJSONLogDurations(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLoggerTo(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("took", "took", 1500*time.Millisecond, "n", 3)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if rec["took"] != "1.5s" || rec["n"] != float64(3) {
		t.Errorf("log record %v: want took=\"1.5s\", n=3", rec)
	}
	if _, err := newLoggerTo(&buf, "info", "xml"); err == nil {
		t.Error("log format xml accepted")
	}
}

// --pprof serves Go's profiles on a listener of its own; the API's address
// does not serve them.
func TestServePprof(t *testing.T) {
	n := launch(t, "node", exec.Command(keyfoldBinary(t), "serve", "--config", writeConfig(t, pipelinesYAML),
		"--data", t.TempDir(), "--http", "127.0.0.1:0", "--grpc", "", "--pprof", "127.0.0.1:0"))
	n.waitReady(30 * time.Second)
	m := n.logs.find(regexp.MustCompile(`msg=listening pprof=(\S+)`))
	if m == nil {
		t.Fatalf("no pprof listening line:\n%s", n.logs.tail(10))
	}
	get := func(url string) (int, string) {
		resp, err := n.client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("http://" + m[1] + "/debug/pprof/cmdline"); code != http.StatusOK || !strings.Contains(body, "serve") {
		t.Errorf("pprof cmdline: %d %q", code, body)
	}
	if code, body := get("http://" + m[1] + "/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("pprof heap: %d %.80q", code, body)
	}
	if code, _ := get(n.base + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("the API's address serves /debug/pprof/: %d", code)
	}
}
