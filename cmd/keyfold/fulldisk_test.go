package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size bytes on a temp dir and unmounts it at
// cleanup (registered first, so it runs after the nodes' cleanups). Mounting
// needs root (CI runs as root); elsewhere the test fails saying so, rather
// than skipping and hiding a failure.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("cannot mount a tmpfs for a real full disk (%v: %s): this test needs root, as .ci/run has (run make test as root)",
			err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file at path until the filesystem is full and returns its
// size.
func fill(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	var n int64
	for {
		k, err := f.Write(chunk)
		n += int64(k)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatalf("fill %s: %v", path, err)
		}
	}
}

// scrape returns a metric's value from the node's /metrics ("" if absent).
func (n *node) scrape(name string) (string, error) {
	resp, err := n.client.Get(n.base + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return "", nil
	}
	return string(m[1]), nil
}

func (n *node) status(path string) int {
	resp, err := n.client.Get(n.base + path)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestFullDisk runs a node on a 20 MB tmpfs and fills it while writers
// send: the node must stay up, answer ingest with 503 and Retry-After (and
// say so on /readyz and in keyfold_store_disk_full), lose nothing it
// acknowledged, and take writes again without a restart once a file is
// deleted; every event is then counted exactly once. A start on the full
// disk must fail at once with one clear message, and succeed once space is
// freed.
//
// With the disk reserve (the default) the store refuses ingest before the
// disk is full; without it (disk_reserve: -1) the disk fills up and a WAL
// write fails with ENOSPC, which Pebble cannot continue from: the store
// must reopen itself.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	t.Run("reserve", func(t *testing.T) { t.Parallel(); testFullDisk(t, true) })
	t.Run("no-reserve", func(t *testing.T) { t.Parallel(); testFullDisk(t, false) })
}

func testFullDisk(t *testing.T, reserve bool) {
	mnt := mountTmpfs(t, "20m")
	data, filler := filepath.Join(mnt, "data"), filepath.Join(mnt, "filler")
	seed := testSeed(t)
	yaml := "key_groups: 32\ncheckpoint_interval: 50ms\n"
	if !reserve {
		yaml += "disk_reserve: -1\n"
	}
	cfg := writeConfig(t, yaml+pipelinesYAML)
	n := startNode(t, "node-0", cfg, "--data", data)

	// Writers send logins batches (events with ids, so a batch whose
	// outcome is unknown can be resent safely) and resend each until it is
	// acknowledged; the oracle counts each once, when it is.
	const writers = 3
	w := newWorkload(seed, writers, 90, 3, 20, 60)
	o := newOracle()
	var (
		nAcked, refused, noRetryAfter atomic.Int64
		mu                            sync.Mutex
		unexpected                    []string
		wg                            sync.WaitGroup
		stoppedAt                     atomic.Int64
	)
	stop := make(chan struct{})
	for wr := range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				b := w.next(wr)
				for b.pipeline != "logins" {
					b = w.next(wr)
				}
				o.touch(b)
				for {
					status, hdr, body, err := n.postBatch(b)
					if err == nil && status == http.StatusOK {
						var r ingestReply
						if err := json.Unmarshal(body, &r); err != nil || r.Accepted+r.Duplicates != len(b.events) {
							mu.Lock()
							unexpected = append(unexpected, fmt.Sprintf("batch %s: 200 %s", b.name, body))
							mu.Unlock()
						}
						b.state = acked
						o.add(b)
						nAcked.Add(1)
						break
					}
					if err == nil && status == http.StatusServiceUnavailable {
						refused.Add(1)
						if hdr.Get("Retry-After") == "" {
							noRetryAfter.Add(1)
						}
					} else {
						mu.Lock()
						unexpected = append(unexpected, fmt.Sprintf("batch %s: %d %s %v", b.name, status, body, err))
						mu.Unlock()
					}
					if n.hasExited() {
						return // the test fails below
					}
					if d := stoppedAt.Load(); d != 0 && time.Since(time.Unix(0, d)) > 30*time.Second {
						mu.Lock()
						unexpected = append(unexpected, fmt.Sprintf("batch %s: still refused 30 s after the disk was freed", b.name))
						mu.Unlock()
						return
					}
					time.Sleep(20 * time.Millisecond) // the client's backoff
				}
			}
		})
	}
	stopWriters := func() {
		stoppedAt.Store(time.Now().UnixNano())
		close(stop)
		wg.Wait()
	}

	waitUntil(t, 30*time.Second, "20 acknowledged batches", func() (bool, error) {
		return nAcked.Load() >= 20, nil
	})
	filled := fill(t, filler)
	logsBefore := len(n.logs.grep(""))
	t.Logf("filled the disk with %d MB after %d acknowledged batches", filled>>20, nAcked.Load())
	waitUntil(t, 30*time.Second, "ingest refused with 503", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("the node exited on a full disk (%v):\n%s", n.cmd.ProcessState, n.logs.tail(30))
		}
		return refused.Load() >= 10, nil
	})
	if !reserve {
		waitUntil(t, 30*time.Second, "a failed write, and the store reopening", func() (bool, error) {
			return len(n.logs.grep(`msg="store failed: reopening"`)) > 0, nil
		})
	}
	waitUntil(t, 10*time.Second, "/readyz 503 and keyfold_store_disk_full 1", func() (bool, error) {
		v, err := n.scrape("keyfold_store_disk_full")
		return n.status("/readyz") == http.StatusServiceUnavailable && v == "1", err
	})
	if s := n.status("/healthz"); s != http.StatusOK {
		t.Errorf("/healthz on a full disk = %d, want 200 (the process is alive)", s)
	}
	// The full disk lasts a while: the log must not flood.
	ackedFull := nAcked.Load()
	// A few hundred refused requests (about two seconds of the writers'
	// retries), so that a log flood or an exit would show.
	refusedBefore := refused.Load()
	waitUntil(t, 30*time.Second, "300 more refused requests on the full disk", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("the node exited on a full disk (%v):\n%s", n.cmd.ProcessState, n.logs.tail(30))
		}
		return refused.Load()-refusedBefore >= 300, nil
	})
	// Not counted: the HTTP API's warning for each refused request, and the
	// host's for each failed checkpoint attempt (every 50 ms here).
	var lines, pebbleLines []string
	for _, l := range n.logs.grep("")[logsBefore:] {
		if !strings.Contains(l, `msg="request failed"`) && !strings.Contains(l, `msg="checkpoint failed`) {
			lines = append(lines, l)
		}
		if strings.Contains(l, `msg="pebble`) {
			pebbleLines = append(pebbleLines, l)
		}
	}
	if len(lines) > 30 || len(pebbleLines) > 6 || len(n.logs.grep("goroutine ")) > 0 || len(n.logs.grep("stack trace")) > 0 {
		t.Errorf("%d log lines (%d of Pebble's) in the ~2 s of the full disk (stack traces: %d); want a few:\n%s",
			len(lines), len(pebbleLines), len(n.logs.grep("stack trace")), strings.Join(lines[:min(len(lines), 20)], "\n"))
	}
	t.Logf("full disk: %d requests refused, %d batches acknowledged meanwhile, %d log lines; refused at the reserve: %v, a write failed and the store reopened: %v",
		refused.Load(), nAcked.Load()-ackedFull, len(lines), len(n.logs.grep(`msg="disk full: refusing writes`)) > 0, len(n.logs.grep(`msg="store failed: reopening"`)) > 0)

	// Free space: writes resume, without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	ackedFreed := nAcked.Load()
	waitUntil(t, 30*time.Second, "20 batches acknowledged after the disk was freed", func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("the node exited (%v):\n%s", n.cmd.ProcessState, n.logs.tail(30))
		}
		return nAcked.Load() >= ackedFreed+20, nil
	})
	waitUntil(t, 10*time.Second, "/readyz 200 and keyfold_store_disk_full 0", func() (bool, error) {
		v, err := n.scrape("keyfold_store_disk_full")
		return n.status("/readyz") == http.StatusOK && v == "0", err
	})
	stopWriters()
	if noRetryAfter.Load() > 0 {
		t.Errorf("%d of %d 503 answers had no Retry-After", noRetryAfter.Load(), refused.Load())
	}
	for _, u := range unexpected {
		t.Errorf("unexpected answer: %s", u)
	}
	verify(t, n, o, "after the disk was freed")

	// A start on a full disk fails at once, with one clear message.
	if code, _ := n.terminate(30 * time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit code %d:\n%s", code, n.logs.tail(30))
	}
	fill(t, filler)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, keyfoldBinary(t), "serve", "--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data", data).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("a start on a full disk hangs (killed after 30 s); its output ends:\n%s", tailOf(out, 20))
	case !errors.As(err, &ee) || ee.ExitCode() != 1:
		t.Fatalf("a start on a full disk: %v, want exit code 1; output:\n%s", err, tailOf(out, 20))
	}
	last := lastLine(out)
	if !strings.HasPrefix(last, "error: ") || !strings.Contains(last, data) || !strings.Contains(last, "ENOSPC") {
		t.Errorf("a start on a full disk ends with %q, want an error naming %s and ENOSPC", last, data)
	}
	if nl := bytes.Count(out, []byte("\n")); nl > 10 || bytes.Contains(out, []byte("goroutine ")) {
		t.Errorf("a start on a full disk wrote %d lines, want a few:\n%s", nl, tailOf(out, 20))
	}
	t.Logf("start on a full disk: exit 1 after %v: %s", time.Since(start).Round(time.Millisecond), last)

	// Once space is freed it starts, with every acknowledged event.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n = startNode(t, "node-1", cfg, "--data", data)
	verify(t, n, o, "after a restart")
}

// postBatch sends a batch and returns the answer whole.
func (n *node) postBatch(b *batch) (int, http.Header, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, n.base+"/v1/pipelines/"+b.pipeline+"/events", bytes.NewReader(b.body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", b.contentType)
	resp, err := n.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, bytes.TrimSpace(body), err
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

func tailOf(out []byte, k int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-k):], "\n")
}
