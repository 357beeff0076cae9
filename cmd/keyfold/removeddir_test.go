//go:build unix

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRemovedDataDir removes a running node's data directory (rm -rf) and
// keeps sending: once Pebble's memtable is full it cannot create its next
// WAL and is wedged for good. The node must answer ingest with 503 rather
// than hang, and exit on SIGTERM, with an error, instead of waiting forever
// in its drain's final checkpoint. The tmpfs is small so that the memtable
// is (1 MiB on 20 MB, see embedded.Options.MemTableSize).
func TestRemovedDataDir(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, "20m")
	data := filepath.Join(mnt, "data")
	cfg := writeConfig(t, "key_groups: 8\ncheckpoint_interval: 50ms\n"+pipelinesYAML)
	n := startNode(t, "node-0", cfg, "--data", data)
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}

	// Batches of 200 clicks of about 500 bytes, until one is refused.
	pad := strings.Repeat("x", 400)
	var sent, i atomic.Int64
	post := func() (int, string, error) {
		var sb strings.Builder
		sb.WriteString("[")
		for k := range 200 {
			if k > 0 {
				sb.WriteString(",")
			}
			fmt.Fprintf(&sb, `{"page":"p%d","n":1,"pad":%q}`, i.Add(1)%5000, pad)
		}
		sb.WriteString("]")
		b := &batch{pipeline: "clicks", body: []byte(sb.String()), contentType: "application/json"}
		code, _, body, err := n.postBatch(b)
		sent.Add(1)
		return code, string(body), err
	}
	var refusedBody string
	waitUntil(t, 60*time.Second, "ingest refused with 503", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("the node exited (%v):\n%s", n.cmd.ProcessState, n.logs.tail(30))
		}
		code, body, err := post()
		switch {
		case err != nil:
			return false, fmt.Errorf("batch %d: %v (the node hangs?)", sent.Load(), err)
		case code == http.StatusServiceUnavailable:
			refusedBody = body
			return true, nil
		case code != http.StatusOK:
			return false, fmt.Errorf("batch %d: %d %s", sent.Load(), code, body)
		}
		return false, nil
	})
	t.Logf("batch %d refused: %s", sent.Load(), refusedBody)
	// The next ones are refused too, at once.
	for range 5 {
		start := time.Now()
		code, body, err := post()
		if err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("a batch after the store failed = %d %s, %v; want 503", code, body, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("a refused batch took %v", d)
		}
	}
	waitUntil(t, 10*time.Second, "/readyz 503", func() (bool, error) {
		return n.status("/readyz") == http.StatusServiceUnavailable, nil
	})
	if s := n.status("/healthz"); s != http.StatusOK {
		t.Errorf("/healthz with a failed store = %d, want 200 (the process is alive)", s)
	}
	if len(n.logs.grep(`data directory was removed`)) == 0 {
		t.Errorf("the node's log does not say that the data directory was removed:\n%s", n.logs.tail(30))
	}

	code, took := n.terminate(30 * time.Second)
	t.Logf("exit code %d, %v after SIGTERM; log ends:\n%s", code, took.Round(time.Millisecond), n.logs.tail(8))
	if code == 0 {
		t.Errorf("exit code 0 after its store failed for good, want an error")
	}
	if last := n.logs.tail(1); !strings.Contains(last, "restart the process") {
		t.Errorf("the node's last line is %q, want the store's error saying to restart the process", last)
	}
}
