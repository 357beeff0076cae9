package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/keyfold/keyfold/services/grpcapi/client"
	"github.com/keyfold/keyfold/services/httpapi"
)

func newBench() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load a node with synthetic events and report durable ingest throughput",
		Long: `Load a running node over HTTP (--http, the default) or gRPC (--addr)
with synthetic login
events (the fields of examples/quickstart.yaml: user_id, event_id, type,
amount, geo.country) from --concurrency clients, each sending batches of
--batch events over --keys keys and waiting for each acknowledgement, for
--duration. Run it as a process of its own, so the load generator and the
node are measured apart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			if f.Changed("grpc") { // the old name of --addr
				if f.Changed("addr") {
					return errors.New("--grpc is the old name of --addr: give one of them")
				}
				o.grpc = o.grpcOld
			}
			switch {
			case o.grpc != "" && f.Changed("http"):
				return errors.New("load over HTTP (--http) or gRPC (--addr), not both")
			case o.grpc != "":
				for _, a := range strings.Split(o.grpc, ",") {
					if err := checkGRPCAddr("--addr", a); err != nil {
						return err
					}
				}
			}
			return bench(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "http", "http://127.0.0.1:8080", "load over HTTP at the node's base URL (several, comma-separated: the clients take turns, as behind a load balancer)")
	f.StringVar(&o.grpc, "addr", "", "load over gRPC (unary Ingest) at the node's gRPC host:port instead (several, comma-separated)")
	f.StringVar(&o.grpcOld, "grpc", "", "the old name of --addr")
	_ = f.MarkDeprecated("grpc", "use --addr (the node's gRPC host:port, as in every command)")
	f.StringVar(&o.pipeline, "pipeline", "logins", "pipeline to load")
	f.IntVar(&o.keys, "keys", 10_000, "distinct keys")
	f.IntVar(&o.batch, "batch", 100, "events per request")
	f.IntVar(&o.concurrency, "concurrency", 8, "concurrent clients")
	f.DurationVar(&o.duration, "duration", 10*time.Second, "how long to load")
	return cmd
}

type benchOptions struct {
	addr, grpc, pipeline     string
	grpcOld                  string
	keys, batch, concurrency int
	duration                 time.Duration
}

func bench(ctx context.Context, o benchOptions, out io.Writer) error {
	if o.keys < 1 || o.batch < 1 || o.concurrency < 1 || o.duration <= 0 {
		return errors.New("--keys, --batch, --concurrency and --duration must be positive")
	}
	// One ingest function per address; client i loads address i mod n.
	var ingests []func(ctx context.Context, batch []json.RawMessage) error
	if o.grpc != "" {
		for _, addr := range strings.Split(o.grpc, ",") {
			c, err := client.Dial(addr, client.Options{MaxRetries: -1})
			if err != nil {
				return err
			}
			defer c.Close()
			ingests = append(ingests, func(ctx context.Context, batch []json.RawMessage) error {
				raws := make([][]byte, len(batch))
				for i, e := range batch {
					raws[i] = e
				}
				_, err := c.Ingest(ctx, o.pipeline, raws)
				return err
			})
		}
	} else {
		for _, addr := range strings.Split(o.addr, ",") {
			c := &httpapi.Client{Base: addr, HTTP: &http.Client{
				Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency},
				Timeout:   time.Minute,
			}}
			ingests = append(ingests, func(ctx context.Context, batch []json.RawMessage) error {
				_, _, err := c.Ingest(ctx, o.pipeline, batch)
				return err
			})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	run := time.Now().UnixNano() // ids unique across runs
	var (
		seq, events atomic.Int64
		mu          sync.Mutex
		latencies   []time.Duration
		firstErr    error
		wg          sync.WaitGroup
	)
	start := time.Now()
	for client := range o.concurrency {
		ingest := ingests[client%len(ingests)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]json.RawMessage, o.batch)
			var buf bytes.Buffer
			var mine []time.Duration
			for ctx.Err() == nil {
				base := seq.Add(int64(o.batch)) - int64(o.batch)
				buf.Reset()
				offsets := make([]int, 0, o.batch+1)
				for i := range int64(o.batch) {
					n := base + i
					offsets = append(offsets, buf.Len())
					fmt.Fprintf(&buf, `{"user_id":"u%d","event_id":"%d-%d","type":"%s","amount":%d,"geo":{"country":"%s"}}`,
						n%int64(o.keys), run, n, [2]string{"login_ok", "login_failed"}[n%2], n%100, [3]string{"DE", "FR", "US"}[n%3])
				}
				offsets = append(offsets, buf.Len())
				for i := range batch {
					batch[i] = buf.Bytes()[offsets[i]:offsets[i+1]]
				}
				t0 := time.Now()
				if err := ingest(ctx, batch); err != nil {
					// A call cut by the end of the run is not an error (gRPC
					// may report its deadline a moment before ctx does).
					if dl, _ := ctx.Deadline(); ctx.Err() == nil && time.Until(dl) > 100*time.Millisecond {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						cancel()
					}
					break
				}
				mine = append(mine, time.Since(t0))
				events.Add(int64(o.batch))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return fmt.Errorf("bench: %w", firstErr)
	}
	if len(latencies) == 0 {
		return errors.New("bench: no request completed")
	}
	slices.Sort(latencies)
	q := func(p float64) time.Duration {
		return latencies[int(p*float64(len(latencies)-1))].Round(10 * time.Microsecond)
	}
	fmt.Fprintf(out, "%d events in %d requests over %v: %.0f events/s; ack latency p50 %v p90 %v p99 %v max %v\n",
		events.Load(), len(latencies), elapsed.Round(time.Millisecond), float64(events.Load())/elapsed.Seconds(),
		q(0.5), q(0.9), q(0.99), latencies[len(latencies)-1].Round(10*time.Microsecond))
	return nil
}
