package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// cpuStats is the CPU the measured phase cost per acknowledged event: the
// node's (process_cpu_seconds_total, with --metrics), Redis's (INFO cpu,
// with --redis-info) and this load generator's own. Where they share a
// machine's cores, throughput follows their sum, so the sum compares
// targets more steadily than events/s on a machine with noisy neighbours;
// the parts say which process pays. (The samples are taken before the
// measured phase and once its last ack is in, so the work of the acks that
// came after its end, at most a window per client, is counted too.)
type cpuStats struct {
	NodeCPU   float64 `json:"node_cpu_us_per_event,omitempty"`
	RedisCPU  float64 `json:"redis_cpu_us_per_event,omitempty"`
	ClientCPU float64 `json:"client_cpu_us_per_event,omitempty"`
	// StoreFlushed and StoreCompacted are the bytes of tables the node's
	// embedded store flushed and compacted per event (with --metrics, from
	// keyfold_store_flushed_bytes_total and _compacted_bytes_total; 0 on
	// another store).
	StoreFlushed   float64 `json:"node_store_flushed_bytes_per_event,omitempty"`
	StoreCompacted float64 `json:"node_store_compacted_bytes_per_event,omitempty"`
}

// cpuSample is the CPU seconds each process used so far, and the bytes the
// node's embedded store wrote into tables.
type cpuSample struct{ node, redis, client, flushed, compacted float64 }

// readCPU samples the CPU seconds of the node, Redis and this process.
func readCPU(ctx context.Context, o benchOptions) (cpuSample, error) {
	var s cpuSample
	if o.metrics != "" {
		v, found, err := scrape(ctx, o.metrics, "process_cpu_seconds_total", "keyfold_store_flushed_bytes_total", "keyfold_store_compacted_bytes_total")
		if err != nil {
			return s, err
		}
		if !found[0] {
			return s, fmt.Errorf("--metrics: %s has no process_cpu_seconds_total", o.metrics)
		}
		s.node, s.flushed, s.compacted = v[0], v[1], v[2] // (0 where not found: not the embedded store)
	}
	if o.redisInfo != "" {
		err := withRedisInfo(o, func(rdb *redis.Client) error {
			info, err := rdb.InfoMap(ctx, "cpu").Result()
			if err != nil {
				return err
			}
			for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
				v, err := strconv.ParseFloat(info["CPU"][f], 64)
				if err != nil {
					return fmt.Errorf("INFO cpu %s: %w", f, err)
				}
				s.redis += v
			}
			return nil
		})
		if err != nil {
			return s, err
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s, fmt.Errorf("bench: getrusage: %w", err)
	}
	s.client = tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
	return s, nil
}

// withRedisInfo calls f with a client of the --redis-info Redis; its
// errors come back naming the flag.
func withRedisInfo(o benchOptions, f func(rdb *redis.Client) error) error {
	opts, err := redis.ParseURL(o.redisInfo)
	if err != nil {
		return fmt.Errorf("--redis-info: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := f(rdb); err != nil {
		return fmt.Errorf("--redis-info: %w", err)
	}
	return nil
}

func tvSeconds(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }

// perEvent returns what happened between two samples, in µs per event.
// A process not sampled (no --metrics, no --redis-info) stays 0.
func perEvent(before, after cpuSample, o benchOptions, events int64) cpuStats {
	us := func(a, b float64) float64 { return (b - a) * 1e6 / float64(events) }
	c := cpuStats{ClientCPU: us(before.client, after.client)}
	if o.metrics != "" {
		c.NodeCPU = us(before.node, after.node)
		c.StoreFlushed = (after.flushed - before.flushed) / float64(events)
		c.StoreCompacted = (after.compacted - before.compacted) / float64(events)
	}
	if o.redisInfo != "" {
		c.RedisCPU = us(before.redis, after.redis)
	}
	return c
}

func (c cpuStats) String() string {
	s := fmt.Sprintf("cpu per event: node %.1f µs, redis %.1f µs, load generator %.1f µs (sum %.1f µs)",
		c.NodeCPU, c.RedisCPU, c.ClientCPU, c.NodeCPU+c.RedisCPU+c.ClientCPU)
	if c.StoreFlushed+c.StoreCompacted > 0 {
		s += fmt.Sprintf("\nstore tables per event: flushed %.0f B, compacted %.0f B", c.StoreFlushed, c.StoreCompacted)
	}
	return s
}

// profileNode fetches the node's CPU profile of the measured phase (the
// whole seconds of --duration, at least one) from its pprof address into
// --cpu-profile, and sends the outcome; with no --cpu-profile it sends nil
// at once. It starts with the phase, so the profile holds the node's work
// for the load measured and nothing of the preload or warmup.
func profileNode(ctx context.Context, o benchOptions) <-chan error {
	done := make(chan error, 1)
	if o.cpuProfile == "" {
		done <- nil
		return done
	}
	base := o.pprof
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	secs := max(int(o.duration/time.Second), 1)
	go func() {
		done <- func() error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(base, "/"), secs), nil)
			if err != nil {
				return fmt.Errorf("--pprof: %w", err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("--pprof: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("--pprof: GET /debug/pprof/profile: %s", resp.Status)
			}
			f, err := os.Create(o.cpuProfile)
			if err != nil {
				return fmt.Errorf("--cpu-profile: %w", err)
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				f.Close()
				return fmt.Errorf("--cpu-profile: %w", err)
			}
			return f.Close()
		}()
	}()
	return done
}
