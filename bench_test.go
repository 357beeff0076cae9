package keyfold_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/persistence/memstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

const benchYAML = `
pipelines:
  logins:
    key: user_id
    id: event_id
    aggregates:
      total:   { op: count }
      failed:  { op: count, where: "type == 'login_failed'" }
      amount:  { op: sum, field: amount }
      biggest: { op: max, field: amount }
      country: { op: last, field: geo.country }
`

// BenchmarkHTTPIngest measures durable ingest over HTTP: batches of 100
// events over 10k keys, from GOMAXPROCS*4 concurrent clients, so group
// commit has something to group. It reports events/s, on each store:
// memory (no store at all: nothing durable, the ceiling), embedded (synced
// Pebble batches), and Redis with appendfsync always and everysec (a
// redis-server started for the benchmark, sharing the machine's cores).
func BenchmarkHTTPIngest(b *testing.B) {
	for _, st := range []struct {
		name  string
		setup func(b *testing.B, cfg *keyfold.Config)
	}{
		{"store=memory", func(b *testing.B, cfg *keyfold.Config) { cfg.Store = memstore.New() }},
		{"store=embedded", func(b *testing.B, cfg *keyfold.Config) { cfg.DataDir = b.TempDir() }},
		{"store=redis-always", func(b *testing.B, cfg *keyfold.Config) { cfg.Redis = redistest.Start(b).URL() }},
		{"store=redis-everysec", func(b *testing.B, cfg *keyfold.Config) {
			cfg.Redis = redistest.Start(b, "--appendfsync", "everysec").URL()
		}},
	} {
		b.Run(st.name, func(b *testing.B) {
			cfg, err := keyfold.ParseConfig([]byte(benchYAML))
			if err != nil {
				b.Fatal(err)
			}
			cfg.HTTPAddr = "127.0.0.1:0"
			st.setup(b, &cfg)
			benchHTTPIngest(b, run(b, cfg))
		})
	}
}

// benchHTTPIngest loads the nodes over HTTP, the clients taking turns over
// them (as behind a load balancer), and reports on the first.
func benchHTTPIngest(b *testing.B, nodes ...*keyfold.Node) {
	n := nodes[0]
	var urls []string
	for _, node := range nodes {
		urls = append(urls, "http://"+node.HTTPAddr()+"/v1/pipelines/logins/events")
	}
	var turn atomic.Int64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: time.Minute}

	const batch = 100
	var seq atomic.Int64
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		url := urls[int(turn.Add(1))%len(urls)]
		var body bytes.Buffer
		for pb.Next() {
			body.Reset()
			body.WriteByte('[')
			base := seq.Add(batch)
			for i := range int64(batch) {
				if i > 0 {
					body.WriteByte(',')
				}
				id := base + i
				fmt.Fprintf(&body, `{"user_id":"u%d","event_id":"e%d","type":"login_failed","amount":%d,"geo":{"country":"DE"}}`, id%10000, id, id%100)
			}
			body.WriteByte(']')
			resp, err := client.Post(url, "application/json", &body)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	if st := n.Stats(); st.Commits > 0 {
		b.ReportMetric(float64(st.Events)/float64(st.Commits), "events/commit")
	}
	b.ReportMetric(float64(seq.Load())/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(seq.Load()), "ns/event")
}

// BenchmarkHTTPIngestWindows is BenchmarkHTTPIngest on the embedded store
// with windows on (event time is ingest time, so windows close, emit and
// store their results while the load runs) against aggregates only: a
// tumbling 1 s window, and a sliding 10 s window every 2 s (5 windows an
// event) on top. With 10k keys, each key emits a result a second per window.
func BenchmarkHTTPIngestWindows(b *testing.B) {
	for _, c := range []struct{ name, windows string }{
		{"none", ""},
		{"tumbling", `
    windows:
      per_second: { type: tumbling, size: 1s, aggregates: [total, amount] }
`},
		{"tumbling+sliding", `
    windows:
      per_second: { type: tumbling, size: 1s, aggregates: [total, amount] }
      last_10s:   { type: sliding, size: 10s, slide: 2s, aggregates: [total] }
`},
		{"patterns+sketches", `      countries: { op: distinct, field: geo.country }
      amounts:   { op: quantiles, field: amount }
    patterns:
      brute:     { where: "type == 'login_failed'", count: 3, within: 1m }
      ok_failed: { sequence: ["type == 'login_ok'", "type == 'login_failed'"], within: 1m }
      no_ok:     { after: "type == 'login_failed'", absent: "type == 'login_ok'", within: 10s }
`},
	} {
		b.Run("windows="+c.name, func(b *testing.B) {
			cfg, err := keyfold.ParseConfig([]byte(benchYAML + c.windows))
			if err != nil {
				b.Fatal(err)
			}
			cfg.HTTPAddr = "127.0.0.1:0"
			cfg.DataDir = b.TempDir()
			n := run(b, cfg)
			benchHTTPIngest(b, n)
			b.ReportMetric(float64(n.Stats().Pipelines["logins"].Emitted), "outputs")
		})
	}
}

// BenchmarkClusterIngest is BenchmarkHTTPIngest against a cluster of 1, 2
// and 3 nodes in this process on one Redis (appendfsync always), the
// clients taking turns over the nodes. Everything shares this machine's
// cores: the figure is the cost of routing and forwarding, not scaling.
func BenchmarkClusterIngest(b *testing.B) {
	for _, size := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("nodes=%d", size), func(b *testing.B) {
			url := redistest.Start(b).URL()
			var nodes []*keyfold.Node
			for range size {
				cfg, err := keyfold.ParseConfig([]byte(benchYAML))
				if err != nil {
					b.Fatal(err)
				}
				cfg.HTTPAddr, cfg.GRPCAddr, cfg.Redis, cfg.Cluster = "127.0.0.1:0", "127.0.0.1:0", url, "bench"
				nodes = append(nodes, run(b, cfg))
			}
			waitStable(b, nodes[0], size) // every member serves its share
			benchHTTPIngest(b, nodes...)
		})
	}
}
