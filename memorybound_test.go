//go:build !race

package keyfold_test

// The race detector changes what is allocated and how fast: a heap bound
// measured under it says nothing about the node's. This test runs in the
// plain pass of make test.

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
)

// peakHeap samples the heap in use until stopped and returns the largest
// value seen above what was in use when it started (after a GC).
func peakHeap() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > base && m.HeapInuse-base > peak.Load() {
				peak.Store(m.HeapInuse - base)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// TestIngestMemoryBounded: 64 concurrent maximal requests (max_body_bytes
// of 11-byte events, the shape that cost 60x its size) keep the heap's peak
// within 4 x max_ingest_bytes (what is in flight, the garbage it leaves,
// twice over for the GC's slack at GOGC=100) + 2 x what the node keeps once
// they are done + 8 MiB: the requests that do not fit get 429 and are sent
// again. Measured: 45-57 MiB against a bound of ~83 MiB. Before the limits
// and the member-by-member decoding all 64 were processed at once and the
// heap peaked at ~580 MiB.
func TestIngestMemoryBounded(t *testing.T) {
	const (
		bodyBytes = 256 << 10
		budget    = 16 << 20
		requests  = 64
	)
	cfg, err := keyfold.ParseConfig([]byte(fmt.Sprintf(`
max_body_bytes: %d
max_batch_events: 25000
max_ingest_bytes: %d
max_concurrent_ingests: %d
pipelines:
  p:
    key: k
    aggregates:
      n: { op: count }
`, bodyBytes, budget, requests)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	n := run(t, cfg)
	url := "http://" + n.HTTPAddr() + "/v1/pipelines/p/events"

	var body bytes.Buffer // shared by the clients: their memory is not the node's
	events := 0
	for ; ; events++ {
		line := fmt.Sprintf("{\"k\":\"%d\"}\n", events%1000)
		if body.Len()+len(line) > bodyBytes {
			break
		}
		body.WriteString(line)
	}
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: requests, MaxIdleConnsPerHost: requests}, Timeout: 2 * time.Minute}

	runtime.GC()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	stop := peakHeap()
	var wg sync.WaitGroup
	var refused atomic.Int64
	errs := make(chan error, requests)
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				resp, err := client.Post(url, "application/x-ndjson", bytes.NewReader(body.Bytes()))
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					return
				case http.StatusTooManyRequests:
					if resp.Header.Get("Retry-After") == "" {
						errs <- fmt.Errorf("429 without Retry-After: %s", b)
						return
					}
					refused.Add(1)
					time.Sleep(20 * time.Millisecond) // the client's back-off (shorter than Retry-After, to keep the test short)
				default:
					errs <- fmt.Errorf("ingest: %d %s", resp.StatusCode, b)
					return
				}
			}
		}()
	}
	wg.Wait()
	peak := stop()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	kept := int64(ms.HeapInuse) - int64(ms0.HeapInuse)
	allowed := uint64(4*budget + 2*max(kept, 0) + 8<<20)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d requests of %d bytes (%d events each): heap peak %.1f MiB above the start, %.1f MiB kept after, %d refused with 429 and sent again",
		requests, body.Len(), events, float64(peak)/(1<<20), float64(kept)/(1<<20), refused.Load())
	if peak > allowed {
		t.Errorf("heap peaked %.1f MiB above the start, more than %.1f MiB: 4 x max_ingest_bytes (%d MiB) + 2 x %.1f MiB kept + 8 MiB",
			float64(peak)/(1<<20), float64(allowed)/(1<<20), budget>>20, float64(kept)/(1<<20))
	}
	if st := n.Stats(); st.Events < int64(requests*events) {
		t.Errorf("%d events applied, want %d", st.Events, requests*events)
	}
}
