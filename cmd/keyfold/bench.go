package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
)

func newBench() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load a node (or, for comparison, Redis by hand) with synthetic events and report durable ingest throughput",
		Long: `Load a running node over HTTP (--http, the default) or gRPC (--addr)
with synthetic login events (the fields of examples/bench.yaml: user_id,
event_id, type, amount, geo.country) from --concurrency clients, each
sending batches of --batch events and waiting for each acknowledgement,
for --duration. With --stream each gRPC client keeps up to --window
batches in flight on one IngestStream instead.

Keys are drawn from --keys distinct ones, uniformly or Zipf-skewed
(--dist zipf, --zipf-s). --preload first sends one event to every key, so
that the measured phase finds every key stored already (steady state);
with --metrics it then waits until the node has checkpointed them
(keyfold_dirty_keys 0), so that the first checkpoint of a million new keys
is not measured as part of the steady state. --warmup loads for a while
before measuring; --warmup-events loads that many events instead (or
first, with both), so that two builds are measured after the same load,
not after the same time: a faster build given the same minutes applies
more events, and its keys remember more ids when it is measured.

--naive-redis URL loads a Redis by hand instead of a node, the design
users write without keyfold: per event one Lua script (SET NX of the id
with a 24h TTL, then HINCRBY/HINCRBYFLOAT/HSET of the key's hash),
pipelined per batch. Give the Redis appendonly yes and appendfsync always
so that its replies are as durable as keyfold's acks.

--metrics URL (the node's HTTP base) and --redis-info URL add memory
figures: the node's RSS and heap per key in memory, Redis used_memory per
key. --json prints every figure as one JSON object.

Run it as a process of its own, so the load generator and the node are
measured apart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if f.Changed("grpc") { // the old name of --addr
				if f.Changed("addr") {
					return errors.New("--grpc is the old name of --addr: give one of them")
				}
				o.grpc = o.grpcOld
			}
			targets := 0
			for _, set := range []bool{o.grpc != "", f.Changed("http"), o.naiveRedis != ""} {
				if set {
					targets++
				}
			}
			if targets > 1 {
				return errors.New("load one target: a node over HTTP (--http) or gRPC (--addr), or Redis by hand (--naive-redis)")
			}
			if o.grpc != "" {
				for _, a := range strings.Split(o.grpc, ",") {
					if err := checkGRPCAddr("--addr", a); err != nil {
						return err
					}
				}
			}
			if !(o.rate >= 0) || math.IsInf(o.rate, 1) {
				return fmt.Errorf("--rate must be a number of events per second, 0 or more (got %v)", o.rate)
			}
			if o.stream && o.grpc == "" && o.naiveRedis == "" {
				return errors.New("--stream loads over gRPC (or Redis by hand): give the node's --addr")
			}
			if (o.cpuProfile == "") != (o.pprof == "") {
				return errors.New("--cpu-profile FILE and --pprof ADDR go together (the node serves its profiles with serve --pprof ADDR)")
			}
			return bench(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "http", "http://127.0.0.1:8080", "load over HTTP at the node's base URL (several, comma-separated: the clients take turns, as behind a load balancer)")
	f.StringVar(&o.grpc, "addr", "", "load over gRPC at the node's gRPC host:port instead (several, comma-separated)")
	f.StringVar(&o.grpcOld, "grpc", "", "the old name of --addr")
	_ = f.MarkDeprecated("grpc", "use --addr (the node's gRPC host:port, as in every command)")
	f.StringVar(&o.naiveRedis, "naive-redis", "", "load this Redis by hand (one Lua script call per event, pipelined per batch) instead of a node, for comparison")
	f.BoolVar(&o.stream, "stream", false, "gRPC: one IngestStream per client with up to --window batches awaiting their acks (default: unary Ingest, one batch at a time); with --naive-redis, up to --window pipelines in flight per client")
	f.IntVar(&o.window, "window", 8, "with --stream: batches in flight per client")
	f.StringVar(&o.pipeline, "pipeline", "logins", "pipeline to load")
	f.IntVar(&o.keys, "keys", 10_000, "distinct keys")
	f.StringVar(&o.dist, "dist", "uniform", "key distribution: uniform, or zipf (a few hot keys, a long tail)")
	f.Float64Var(&o.zipfS, "zipf-s", 1.1, "with --dist zipf: the exponent (> 1; larger is more skewed)")
	f.BoolVar(&o.preload, "preload", false, "first send one event to every key (not measured), so that the measured phase finds every key stored")
	f.DurationVar(&o.warmup, "warmup", 0, "load this long before measuring")
	f.Int64Var(&o.warmupEvents, "warmup-events", 0, "load this many events before measuring (with --warmup, whichever ends first)")
	f.DurationVar(&o.preloadTimeout, "preload-timeout", 10*time.Minute, "with --preload and --metrics, how long to wait for the node to checkpoint the preloaded keys")
	f.IntVar(&o.batch, "batch", 100, "events per request")
	f.IntVar(&o.concurrency, "concurrency", 8, "concurrent clients")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure")
	f.StringVar(&o.trace, "trace", "", "write every acknowledged batch of the measured phase to this file, one line each: when it was due (ms since the phase began) and its ack latency (ms), to see when a target stalls")
	f.Float64Var(&o.rate, "rate", 0, "events/s to offer in the measured phase, all clients together (0: as fast as the target acks); latency counts from each batch's scheduled time, so a target that falls behind shows it")
	f.StringVar(&o.metrics, "metrics", "", "the node's HTTP base URL, to report its memory and CPU per event from /metrics")
	f.StringVar(&o.redisInfo, "redis-info", "", "a Redis URL, to report its used_memory per key and CPU per event")
	f.StringVar(&o.cpuProfile, "cpu-profile", "", "write the node's CPU profile of the measured phase to this file (from the node's `serve --pprof` address, given as --pprof)")
	f.StringVar(&o.pprof, "pprof", "", "with --cpu-profile: the node's pprof address (host:port or URL)")
	f.BoolVar(&o.json, "json", false, "print the figures as one JSON object")
	return cmd
}

type benchOptions struct {
	addr, grpc, grpcOld, naiveRedis  string
	pipeline                         string
	stream                           bool
	window                           int
	keys, batch, concurrency         int
	dist                             string
	zipfS                            float64
	preload                          bool
	rate                             float64 // events/s offered while measuring; 0: closed loop
	warmup, duration, preloadTimeout time.Duration
	warmupEvents                     int64 // events to load before measuring (0: --warmup alone)
	metrics, redisInfo               string
	json                             bool
	trace                            string // a file for every ack of the measured phase
	cpuProfile, pprof                string // the node's CPU profile of the measured phase, and where to get it
}

// benchEvent is one synthetic event before a sink renders it: its key's
// number and its sequence number in the run.
type benchEvent struct {
	key int
	n   int64
}

// benchRun names the run, so ids are unique across runs on one store.
var benchRun = time.Now().UnixNano()

func (e benchEvent) failed() bool    { return e.n%2 == 1 }
func (e benchEvent) amount() int64   { return e.n % 100 }
func (e benchEvent) country() string { return [3]string{"DE", "FR", "US"}[e.n%3] }
func (e benchEvent) id() string      { return fmt.Sprintf("%d-%d", benchRun, e.n) }

// appendJSON renders the event as the quickstart's login event.
func (e benchEvent) appendJSON(b []byte) []byte {
	typ := "login_ok"
	if e.failed() {
		typ = "login_failed"
	}
	return fmt.Appendf(b, `{"user_id":"u%d","event_id":"%s","type":"%s","amount":%d,"geo":{"country":"%s"}}`,
		e.key, e.id(), typ, e.amount(), e.country())
}

// sink takes batches for one client: send returns once the batch is on its
// way (unary sinks: once it is acknowledged) and done is called with its
// outcome when it is durable or failed.
type sink interface {
	send(ctx context.Context, batch []benchEvent, done func(error)) error
	close() error
}

// keyPicker draws key numbers by the distribution.
type keyPicker func() int

func newKeyPicker(o benchOptions, seed uint64) (keyPicker, error) {
	r := rand.New(rand.NewPCG(seed, uint64(benchRun)))
	switch o.dist {
	case "uniform":
		return func() int { return r.IntN(o.keys) }, nil
	case "zipf":
		if o.zipfS <= 1 {
			return nil, fmt.Errorf("--zipf-s must be above 1, got %v", o.zipfS)
		}
		z := rand.NewZipf(r, o.zipfS, 1, uint64(o.keys-1))
		return func() int { return int(z.Uint64()) }, nil
	}
	return nil, fmt.Errorf("--dist: want uniform or zipf, got %q", o.dist)
}

// benchResult is what a run measured.
type benchResult struct {
	Target     string  `json:"target"`
	Keys       int     `json:"keys"`
	Dist       string  `json:"dist"`
	Events     int64   `json:"events"`
	Requests   int     `json:"requests"`
	Seconds    float64 `json:"seconds"`
	EventsPerS float64 `json:"events_per_s"`
	P50Ms      float64 `json:"p50_ms"`
	P90Ms      float64 `json:"p90_ms"`
	P99Ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	PreloadedS float64 `json:"preload_seconds,omitempty"`
	SettledS   float64 `json:"preload_checkpointed_seconds,omitempty"` // after the preload, until the node stored it
	// WarmupEvents were acknowledged in the WarmupS of the warm-up.
	WarmupEvents int64   `json:"warmup_events,omitempty"`
	WarmupS      float64 `json:"warmup_seconds,omitempty"`
	Rate         float64 `json:"rate,omitempty"` // events/s offered (--rate)
	memoryStats
	cpuStats
}

func bench(ctx context.Context, o benchOptions, out io.Writer) error {
	if o.keys < 1 || o.batch < 1 || o.concurrency < 1 || o.duration <= 0 || o.window < 1 || o.preloadTimeout <= 0 {
		return errors.New("--keys, --batch, --concurrency, --window, --duration and --preload-timeout must be positive")
	}
	if o.warmup < 0 || o.warmupEvents < 0 {
		return errors.New("--warmup and --warmup-events must not be negative")
	}
	if _, err := newKeyPicker(o, 0); err != nil {
		return err
	}
	newSink, target, cleanup, err := openSinks(ctx, o)
	if err != nil {
		return err
	}
	defer cleanup()
	sinks := make([]sink, o.concurrency)
	for i := range sinks {
		if sinks[i], err = newSink(ctx, i); err != nil {
			return err
		}
	}
	defer func() {
		for _, s := range sinks {
			s.close()
		}
	}()
	var seq atomic.Int64 // event numbers, unique in the run
	res := benchResult{Target: target, Keys: o.keys, Dist: o.dist, Rate: o.rate}

	if o.preload {
		start := time.Now()
		var next atomic.Int64
		if _, _, err := loadPhase(ctx, o, sinks, &seq, 0, 0, func(int) keyPicker {
			return func() int {
				k := int(next.Add(1) - 1)
				if k >= o.keys {
					return -1
				}
				return k
			}
		}, nil); err != nil {
			return fmt.Errorf("bench: preload: %w", err)
		}
		res.PreloadedS = time.Since(start).Seconds()
		if o.metrics != "" {
			start = time.Now()
			if err := waitCheckpointed(ctx, o.metrics, o.preloadTimeout); err != nil {
				return fmt.Errorf("bench: after the preload: %w", err)
			}
			res.SettledS = time.Since(start).Seconds()
		}
	}
	pickers := func(i int) keyPicker { p, _ := newKeyPicker(o, uint64(i)+1); return p }
	if o.warmup > 0 || o.warmupEvents > 0 {
		picked := atomic.Int64{} // with --warmup-events: the events the warm-up sent
		warm := func(i int) keyPicker {
			pick := pickers(i)
			if o.warmupEvents == 0 {
				return pick
			}
			return func() int {
				if picked.Add(1) > o.warmupEvents {
					return -1
				}
				return pick()
			}
		}
		start := time.Now()
		n, _, err := loadPhase(ctx, o, sinks, &seq, o.warmup, 0, warm, nil)
		if err != nil {
			return fmt.Errorf("bench: warmup: %w", err)
		}
		res.WarmupEvents, res.WarmupS = n, time.Since(start).Seconds()
	}
	var trace io.Writer // nil: no trace
	if o.trace != "" {
		f, err := os.Create(o.trace)
		if err != nil {
			return fmt.Errorf("bench: --trace: %w", err)
		}
		defer f.Close()
		w := bufio.NewWriter(f)
		defer w.Flush()
		trace = w
	}
	cpu0, err := readCPU(ctx, o)
	if err != nil {
		return err
	}
	profiled := profileNode(ctx, o)
	start := time.Now()
	events, latencies, err := loadPhase(ctx, o, sinks, &seq, o.duration, o.rate, pickers, trace)
	// Acks that came after the phase's end are not counted, nor is the
	// time spent waiting for them.
	elapsed := min(time.Since(start), o.duration)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := <-profiled; err != nil {
		return err
	}
	cpu1, err := readCPU(ctx, o)
	if err != nil {
		return err
	}
	if len(latencies) == 0 {
		return errors.New("bench: no request completed")
	}
	slices.Sort(latencies)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	q := func(p float64) time.Duration { return latencies[int(p*float64(len(latencies)-1))] }
	res.Events, res.Requests, res.Seconds = events, len(latencies), elapsed.Seconds()
	res.EventsPerS = float64(events) / elapsed.Seconds()
	res.P50Ms, res.P90Ms, res.P99Ms, res.MaxMs = ms(q(0.5)), ms(q(0.9)), ms(q(0.99)), ms(latencies[len(latencies)-1])
	res.cpuStats = perEvent(cpu0, cpu1, o, events)
	if err := res.memoryStats.collect(ctx, o); err != nil {
		return fmt.Errorf("bench: memory figures: %w", err)
	}
	if o.json {
		return json.NewEncoder(out).Encode(res)
	}
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	fmt.Fprintf(out, "%d events in %d requests over %v: %.0f events/s; ack latency p50 %v p90 %v p99 %v max %v\n",
		events, len(latencies), elapsed.Round(time.Millisecond), res.EventsPerS,
		r(q(0.5)), r(q(0.9)), r(q(0.99)), r(latencies[len(latencies)-1]))
	if s := res.memoryStats.String(); s != "" {
		fmt.Fprintln(out, s)
	}
	fmt.Fprintln(out, res.cpuStats)
	return nil
}

// loadPhase runs every client for d (0: until its picker returns -1) and
// returns the events acknowledged and each batch's ack latency. With a rate
// (events/s, all clients together) each client sends its batches on a
// schedule instead of as fast as they are acknowledged, and a batch's
// latency counts from its scheduled time (a send held up by a full window
// is late, not excused: no coordinated omission).
func loadPhase(ctx context.Context, o benchOptions, sinks []sink, seq *atomic.Int64, d time.Duration, rate float64, picker func(int) keyPicker, trace io.Writer) (int64, []time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	var (
		events    atomic.Int64
		mu        sync.Mutex
		latencies []time.Duration
		firstErr  error
		wg        sync.WaitGroup
	)
	fail := func(err error) {
		// A call cut by the end of the phase is not an error (gRPC may
		// report its deadline a moment before ctx does).
		if dl, ok := ctx.Deadline(); ctx.Err() != nil || ok && time.Until(dl) < 100*time.Millisecond {
			return
		}
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	var every time.Duration // a client's batches are this far apart (rate > 0)
	if rate > 0 {
		every = time.Duration(float64(time.Second) * float64(o.batch*len(sinks)) / rate)
	}
	begin := time.Now()
	var traceMu sync.Mutex
	if trace != nil {
		fmt.Fprintf(trace, "# begin %s (unix ms %d); then per acknowledged batch: ms since begin it was due (sent), ack latency ms\n",
			begin.UTC().Format(time.RFC3339Nano), begin.UnixMilli())
	}
	for i, s := range sinks {
		pick := picker(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			var inflight sync.WaitGroup
			var mineMu sync.Mutex
			// The clients' schedules are staggered over one interval.
			due := begin.Add(every * time.Duration(i) / time.Duration(len(sinks)))
			for ctx.Err() == nil {
				if every > 0 {
					if wait := time.Until(due); wait > 0 {
						t := time.NewTimer(wait)
						select {
						case <-t.C:
						case <-ctx.Done():
							t.Stop()
						}
						if ctx.Err() != nil {
							break
						}
					}
				}
				batch := make([]benchEvent, 0, o.batch)
				for range o.batch {
					k := pick()
					if k < 0 {
						break
					}
					batch = append(batch, benchEvent{key: k, n: seq.Add(1)})
				}
				if len(batch) == 0 {
					break
				}
				t0 := time.Now()
				if every > 0 {
					t0, due = due, due.Add(every)
				}
				inflight.Add(1)
				n := int64(len(batch))
				err := s.send(ctx, batch, func(err error) {
					defer inflight.Done()
					if err != nil {
						fail(err)
						return
					}
					if ctx.Err() == nil {
						if trace != nil {
							traceMu.Lock()
							fmt.Fprintf(trace, "%d %d\n", t0.Sub(begin).Milliseconds(), time.Since(t0).Milliseconds())
							traceMu.Unlock()
						}
						mineMu.Lock()
						mine = append(mine, time.Since(t0))
						mineMu.Unlock()
						events.Add(n)
					}
				})
				if err != nil {
					inflight.Done()
					fail(err)
					break
				}
			}
			inflight.Wait()
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return events.Load(), latencies, firstErr
}
