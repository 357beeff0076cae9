package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/services/grpcapi/client"
	"github.com/keyfold/keyfold/services/httpapi"
)

// openSinks prepares the target of a bench: it returns a constructor of
// one client's sink (client i of the run), the target's name, and what to
// close at the end.
func openSinks(ctx context.Context, o benchOptions) (func(context.Context, int) (sink, error), string, func(), error) {
	switch {
	case o.naiveRedis != "":
		opts, err := redis.ParseURL(o.naiveRedis)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--naive-redis: %w", err)
		}
		opts.PoolSize = o.concurrency + 2
		rdb := redis.NewClient(opts)
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, "", nil, fmt.Errorf("--naive-redis: %w", err)
		}
		if err := naiveScript.Load(ctx, rdb).Err(); err != nil {
			rdb.Close()
			return nil, "", nil, fmt.Errorf("--naive-redis: load the script: %w", err)
		}
		window := 1
		if o.stream {
			window = o.window
		}
		return func(context.Context, int) (sink, error) {
			return &naiveSink{rdb: rdb, pipeline: o.pipeline, slots: make(chan struct{}, window)}, nil
		}, "naive-redis", func() { rdb.Close() }, nil

	case o.grpc != "":
		var clients []*client.Client
		for _, addr := range strings.Split(o.grpc, ",") {
			c, err := client.Dial(addr, client.Options{MaxRetries: -1})
			if err != nil {
				for _, c := range clients {
					c.Close()
				}
				return nil, "", nil, err
			}
			clients = append(clients, c)
		}
		cleanup := func() {
			for _, c := range clients {
				c.Close()
			}
		}
		if o.stream {
			return func(ctx context.Context, i int) (sink, error) {
				st, err := clients[i%len(clients)].Stream(ctx, o.pipeline, o.window)
				if err != nil {
					return nil, err
				}
				return &streamSink{st: st}, nil
			}, "keyfold-grpc-stream", cleanup, nil
		}
		return func(_ context.Context, i int) (sink, error) {
			return &unarySink{ingest: func(ctx context.Context, raws [][]byte) error {
				_, err := clients[i%len(clients)].Ingest(ctx, o.pipeline, raws)
				return err
			}}, nil
		}, "keyfold-grpc", cleanup, nil

	default:
		var clients []*httpapi.Client
		for _, addr := range strings.Split(o.addr, ",") {
			clients = append(clients, &httpapi.Client{Base: addr, HTTP: &http.Client{
				Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency},
				Timeout:   time.Minute,
			}})
		}
		return func(_ context.Context, i int) (sink, error) {
			c := clients[i%len(clients)]
			return &unarySink{ingest: func(ctx context.Context, raws [][]byte) error {
				events := make([]json.RawMessage, len(raws))
				for i, r := range raws {
					events[i] = r
				}
				_, _, err := c.Ingest(ctx, o.pipeline, events)
				return err
			}}, nil
		}, "keyfold-http", func() {}, nil
	}
}

// render turns a batch into the events' JSON, sharing one buffer.
func render(batch []benchEvent) [][]byte {
	buf := make([]byte, 0, len(batch)*110)
	offsets := make([]int, 0, len(batch)+1)
	for _, e := range batch {
		offsets = append(offsets, len(buf))
		buf = e.appendJSON(buf)
	}
	offsets = append(offsets, len(buf))
	raws := make([][]byte, len(batch))
	for i := range raws {
		raws[i] = buf[offsets[i]:offsets[i+1]]
	}
	return raws
}

// unarySink sends a batch and waits for its ack.
type unarySink struct {
	ingest func(ctx context.Context, raws [][]byte) error
}

func (s *unarySink) send(ctx context.Context, batch []benchEvent, done func(error)) error {
	done(s.ingest(ctx, render(batch)))
	return nil
}

func (s *unarySink) close() error { return nil }

// streamSink keeps up to the stream's window of batches in flight.
type streamSink struct{ st *client.Stream }

func (s *streamSink) send(_ context.Context, batch []benchEvent, done func(error)) error {
	return s.st.Send(render(batch), func(_ client.Result, err error) { done(err) })
}

func (s *streamSink) close() error { return s.st.Close() }

// naiveScript is the per-event design users write by hand instead of
// keyfold: remember the id for a day (SET NX PX), and only for a new id
// update the key's hash with the five aggregates of examples/bench.yaml
// (count, count of failed logins, sum and max of amount, last country).
//
// KEYS[1] the id's key, KEYS[2] the key's hash; ARGV: ttl (ms), failed
// (0/1), amount, country.
var naiveScript = redis.NewScript(`
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 0 end
redis.call('HINCRBY', KEYS[2], 'total', 1)
if ARGV[2] == '1' then redis.call('HINCRBY', KEYS[2], 'failed', 1) end
redis.call('HINCRBYFLOAT', KEYS[2], 'amount', ARGV[3])
local m = redis.call('HGET', KEYS[2], 'biggest')
if not m or tonumber(ARGV[3]) > tonumber(m) then redis.call('HSET', KEYS[2], 'biggest', ARGV[3]) end
redis.call('HSET', KEYS[2], 'country', ARGV[4])
return 1
`)

// naiveSink runs naiveScript once per event, pipelined per batch, with up
// to cap(slots) batches in flight (as a stream keeps its window).
type naiveSink struct {
	rdb      *redis.Client
	pipeline string
	slots    chan struct{}
}

const naiveDedupTTL = 24 * time.Hour

func (s *naiveSink) send(ctx context.Context, batch []benchEvent, done func(error)) error {
	p := s.rdb.Pipeline()
	ttl := strconv.FormatInt(naiveDedupTTL.Milliseconds(), 10)
	for _, e := range batch {
		failed := "0"
		if e.failed() {
			failed = "1"
		}
		key := "naive:" + s.pipeline + ":u" + strconv.Itoa(e.key)
		naiveScript.EvalSha(ctx, p, []string{key + ":id:" + e.id(), key}, ttl, failed, e.amount(), e.country())
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	go func() {
		_, err := p.Exec(context.WithoutCancel(ctx)) // in flight: its reply is awaited
		<-s.slots
		done(err)
	}()
	return nil
}

func (s *naiveSink) close() error { return nil }

// memoryStats are the memory figures of a run, read after it.
type memoryStats struct {
	NodeRSS float64 `json:"node_rss_bytes,omitempty"`
	// NodeRSSFile is the part of NodeRSS that maps files: the embedded
	// store's tables, read through mappings (page cache, not the node's
	// own memory). RSSPerKey leaves it out.
	NodeRSSFile    float64 `json:"node_rss_file_bytes,omitempty"`
	NodeHeap       float64 `json:"node_heap_inuse_bytes,omitempty"`
	NodeActiveKeys float64 `json:"node_active_keys,omitempty"`
	// NodeResidentKeys are the keys in memory without an actor, and
	// NodeCachedKeys those whose state the snapshot cache keeps packed, in
	// NodeCacheBytes outside the heap (the count is the cache index's, up
	// to twice the keys it can return). The figures per key divide by the
	// active and resident keys only: RSS includes the cache.
	NodeResidentKeys float64 `json:"node_resident_keys,omitempty"`
	NodeCachedKeys   float64 `json:"node_cached_keys,omitempty"`
	NodeCacheBytes   float64 `json:"node_cache_bytes,omitempty"`
	RSSPerKey        float64 `json:"node_rss_per_key,omitempty"`
	HeapPerKey       float64 `json:"node_heap_per_key,omitempty"`
	RedisUsed        float64 `json:"redis_used_memory_bytes,omitempty"`
	RedisKeys        float64 `json:"redis_keys,omitempty"`
	RedisPerKey      float64 `json:"redis_used_memory_per_bench_key,omitempty"`
}

func (m *memoryStats) collect(ctx context.Context, o benchOptions) error {
	if o.metrics != "" {
		v, err := scrapeMetrics(ctx, o.metrics, "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "keyfold_active_keys", "keyfold_resident_keys",
			"keyfold_cached_keys", "keyfold_cache_bytes", "keyfold_process_resident_file_bytes")
		if err != nil {
			return err
		}
		m.NodeRSS, m.NodeHeap, m.NodeActiveKeys, m.NodeResidentKeys, m.NodeCachedKeys, m.NodeCacheBytes, m.NodeRSSFile = v[0], v[1], v[2], v[3], v[4], v[5], v[6]
		if held := m.NodeActiveKeys + m.NodeResidentKeys; held > 0 {
			m.RSSPerKey, m.HeapPerKey = (m.NodeRSS-m.NodeRSSFile)/held, m.NodeHeap/held
		}
	}
	if o.redisInfo != "" {
		return withRedisInfo(o, func(rdb *redis.Client) error {
			info, err := rdb.InfoMap(ctx, "memory").Result()
			if err != nil {
				return err
			}
			m.RedisUsed, _ = strconv.ParseFloat(info["Memory"]["used_memory"], 64)
			n, err := rdb.DBSize(ctx).Result()
			if err != nil {
				return err
			}
			m.RedisKeys = float64(n)
			m.RedisPerKey = m.RedisUsed / float64(o.keys)
			return nil
		})
	}
	return nil
}

func (m memoryStats) String() string {
	var parts []string
	if m.NodeRSS > 0 {
		parts = append(parts, fmt.Sprintf("node RSS %.0f MiB (%.0f MiB of it mapped files), heap %.0f MiB, %.0f keys in memory, %.0f entries in the snapshot cache (%.0f MiB); per key in memory %.0f B RSS (without mapped files), %.0f B heap",
			m.NodeRSS/(1<<20), m.NodeRSSFile/(1<<20), m.NodeHeap/(1<<20), m.NodeActiveKeys+m.NodeResidentKeys, m.NodeCachedKeys, m.NodeCacheBytes/(1<<20), m.RSSPerKey, m.HeapPerKey))
	}
	if m.RedisUsed > 0 {
		parts = append(parts, fmt.Sprintf("redis used_memory %.0f MiB in %.0f Redis keys (%.0f B per bench key)",
			m.RedisUsed/(1<<20), m.RedisKeys, m.RedisPerKey))
	}
	if len(parts) == 0 {
		return ""
	}
	return "memory: " + strings.Join(parts, "; ")
}

// waitCheckpointed waits, at most timeout, until the node at base (its
// HTTP base URL) has no keys changed since their last snapshot. A node
// without the keyfold_dirty_keys metric is an error: its steady state
// could not be told apart from a checkpoint in flight.
func waitCheckpointed(ctx context.Context, base string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		v, found, err := scrape(ctx, base, "keyfold_dirty_keys")
		if err != nil {
			return err
		}
		if !found[0] {
			return fmt.Errorf("--metrics %s has no keyfold_dirty_keys: cannot tell when the preload is stored", base)
		}
		if v[0] == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the node still has %.0f changed keys to checkpoint after %v (--preload-timeout): %w", v[0], timeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// scrapeMetrics reads the named (unlabelled) samples from a node's
// /metrics, in the order asked; a missing one is 0.
func scrapeMetrics(ctx context.Context, base string, names ...string) ([]float64, error) {
	v, _, err := scrape(ctx, base, names...)
	return v, err
}

// scrape is scrapeMetrics, also saying which samples were found.
func scrape(ctx context.Context, base string, names ...string) ([]float64, []bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/metrics", nil)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("--metrics: GET /metrics: %s", resp.Status)
	}
	want := map[string]int{}
	for i, n := range names {
		want[n] = i
	}
	out, found := make([]float64, len(names)), make([]bool, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if i, named := want[name]; ok && named {
			out[i], _ = strconv.ParseFloat(value, 64)
			found[i] = true
		}
	}
	return out, found, sc.Err()
}
