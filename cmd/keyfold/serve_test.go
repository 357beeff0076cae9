package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
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

// serve sets the Go runtime's memory limit and GOGC from the configuration
// (keyfold.Config.GoRuntime), leaves the environment's when the
// configuration sets neither, and derives them from max_memory otherwise;
// the effective values are on /metrics and in the log.
func TestServeGoRuntime(t *testing.T) {
	const mib = 1 << 20
	env := func(kv ...string) []string {
		var e []string
		for _, v := range os.Environ() {
			if !strings.HasPrefix(v, "GOMEMLIMIT=") && !strings.HasPrefix(v, "GOGC=") {
				e = append(e, v)
			}
		}
		return append(e, kv...)
	}
	for _, tc := range []struct {
		name      string
		config    string
		env       []string
		limit     int64 // 0: derived, only checked to be set
		gogc      string
		logLimit  string
		logSource string
	}{
		{"configured", "go_memory_limit: 629145600\ngo_gc_percent: 250\n", env("GOMEMLIMIT=1GiB", "GOGC=50"), 600 * mib, "250", "600 MiB", "go_memory_limit"},
		{"from the environment", "", env("GOMEMLIMIT=700MiB", "GOGC=150"), 700 * mib, "150", "700 MiB", "GOMEMLIMIT"},
		{"derived from max_memory", "max_memory: 104857600\n", env(), 0, "300", "", "max_memory"},
		{"none", "go_memory_limit: -1\n", env(), math.MaxInt64, "100", "none", "none"},
		// The runtime reports off (-1) as a uint64: 1.8e19 on /metrics.
		{"collector off under the limit", "go_memory_limit: 629145600\ngo_gc_percent: -1\n", env(), 600 * mib, "1.8446744073709552e+19", "600 MiB", "go_memory_limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(keyfoldBinary(t), "serve", "--config", writeConfig(t, tc.config+pipelinesYAML),
				"--data", t.TempDir(), "--http", "127.0.0.1:0", "--grpc", "")
			cmd.Env = tc.env
			n := launch(t, "node", cmd)
			n.waitReady(30 * time.Second)
			limit, err := n.scrape("go_gc_gomemlimit_bytes")
			if err != nil {
				t.Fatal(err)
			}
			gogc, err := n.scrape("go_gc_gogc_percent")
			if err != nil {
				t.Fatal(err)
			}
			got, err := strconv.ParseFloat(limit, 64)
			if err != nil {
				t.Fatalf("go_gc_gomemlimit_bytes %q: %v", limit, err)
			}
			switch {
			case tc.limit == 0:
				// 2 × (100 MiB + the 256 MiB of requests in flight), unless
				// the machine has too little memory for it; at least 256 MiB.
				if got < 256*mib || got > 2*(100+256)*mib {
					t.Errorf("derived memory limit %.0f MiB, want 256 to 712 MiB", got/mib)
				}
			case got != float64(tc.limit):
				t.Errorf("go_gc_gomemlimit_bytes = %s, want %d", limit, tc.limit)
			}
			if gogc != tc.gogc {
				t.Errorf("go_gc_gogc_percent = %s, want %s", gogc, tc.gogc)
			}
			line := n.logs.grep("msg=\"go runtime\"")
			wantGC := "gogc=" + tc.gogc
			if tc.gogc == "1.8446744073709552e+19" {
				wantGC = "gogc=off"
			}
			if len(line) == 0 || !strings.Contains(line[0], "from="+tc.logSource) || !strings.Contains(line[0], wantGC) ||
				(tc.logLimit != "" && !strings.Contains(line[0], "memory_limit=\""+tc.logLimit+"\"") && !strings.Contains(line[0], "memory_limit="+tc.logLimit)) {
				t.Errorf("log line %q: want from=%s, %s, memory_limit=%s", line, tc.logSource, wantGC, tc.logLimit)
			}
		})
	}
}
