package keyfold

import (
	"math"
	"testing"

	"github.com/keyfold/keyfold/persistence/embedded"
)

func TestGoRuntime(t *testing.T) {
	const (
		mib = 1 << 20
		gib = 1 << 30
	)
	frac := func(r float64, n int64) int64 { return int64(r * float64(n)) }
	// capped is the derived limit on a machine of avail bytes with the
	// embedded store's default caches and a snapshot cache of cache bytes.
	capped := func(avail, cache int64) int64 {
		off := float64(cache)
		if cgoEnabled {
			off += 1.15*(embedded.DefaultCacheSize+embedded.IDIndexCacheSize) + 4*embedded.DefaultMemTableSize
		}
		return int64(0.9*float64(avail) - off)
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name      string
		cfg       Config
		available uint64
		getenv    func(string) string
		want      GoRuntime
		warn      bool // some warning expected
	}{
		{
			// 2 × (1 GiB of keys + 256 MiB of requests in flight)
			name:      "defaults",
			available: 24 * gib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: 2 * (gib + DefaultMaxIngestBytes), GCPercent: DefaultGoGCPercent, From: "max_memory"},
		},
		{
			name:      "unknown memory: not capped",
			cfg:       Config{MaxMemory: 8 * gib},
			available: 0,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: 2 * (8*gib + DefaultMaxIngestBytes), GCPercent: DefaultGoGCPercent, From: "max_memory"},
		},
		{
			// 90% of 4 GiB less what the runtime does not count: the
			// snapshot cache's entries (2/3 of a quarter of max_memory,
			// rounded as cacheChunkBytes does) and, with cgo, 1.15 × the
			// block cache and two memtables
			name:      "capped by the memory available, less the memory outside the Go heap",
			cfg:       Config{MaxMemory: 2 * gib},
			available: 4 * gib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: capped(4*gib, gib/2/3*2), GCPercent: DefaultGoGCPercent, From: "max_memory"},
		},
		{
			name:      "a budget too large for the machine is warned of",
			cfg:       Config{MaxMemory: 3 * gib},
			available: 4 * gib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: capped(4*gib, gib/2), GCPercent: DefaultGoGCPercent, From: "max_memory"},
			warn:      true,
		},
		{
			name:   "overflow saturates",
			cfg:    Config{MaxMemory: math.MaxInt64 / 2, CacheMemory: -1},
			getenv: env(),
			want:   GoRuntime{MemoryLimit: math.MaxInt64 / 2, GCPercent: DefaultGoGCPercent, From: "max_memory"},
		},
		{
			name:      "on Redis no block cache is set aside",
			cfg:       Config{MaxMemory: 2 * gib, Redis: "redis://127.0.0.1:6379", CacheMemory: -1},
			available: 4 * gib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: frac(0.9, 4*gib), GCPercent: DefaultGoGCPercent, From: "max_memory"},
		},
		{
			name:      "never below 256 MiB",
			cfg:       Config{MaxMemory: 8 * mib, MaxIngestBytes: 16 * mib},
			available: 300 * mib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: MinGoMemoryLimit, GCPercent: DefaultGoGCPercent, From: "max_memory"},
			warn:      true, // (the block cache alone leaves less than the keys need)
		},
		{
			name:      "set",
			cfg:       Config{GoMemoryLimit: 3 * gib, GoGCPercent: 150},
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "1GiB", "GOGC", "50"),
			want:      GoRuntime{MemoryLimit: 3 * gib, GCPercent: 150, From: "go_memory_limit"},
		},
		{
			name:      "the environment's when unset",
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "1GiB", "GOGC", "50"),
			want:      GoRuntime{From: "GOMEMLIMIT"},
		},
		{
			name:      "GOMEMLIMIT alone: GOGC follows the limit",
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "1GiB"),
			want:      GoRuntime{GCPercent: DefaultGoGCPercent, From: "GOMEMLIMIT"},
		},
		{
			name:      "a malformed GOGC counts as unset (the runtime takes it for 100)",
			available: 24 * gib,
			getenv:    env("GOGC", "300%"),
			want:      GoRuntime{MemoryLimit: 2 * (gib + DefaultMaxIngestBytes), GCPercent: DefaultGoGCPercent, From: "max_memory"},
			warn:      true,
		},
		{
			name:      "GOGC=off with no limit is the environment's, warned of",
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "off", "GOGC", "off"),
			want:      GoRuntime{From: "none"},
			warn:      true,
		},
		{
			name:      "go_gc_percent off with GOMEMLIMIT=off is ignored, warned of",
			cfg:       Config{GoGCPercent: -1},
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "off"),
			want:      GoRuntime{From: "none"},
			warn:      true,
		},
		{
			name:      "GOMEMLIMIT=off: no limit, so Go's GOGC",
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "off"),
			want:      GoRuntime{From: "none"},
		},
		{
			name:      "no limit",
			cfg:       Config{GoMemoryLimit: -1},
			available: 24 * gib,
			getenv:    env("GOMEMLIMIT", "1GiB"),
			want:      GoRuntime{MemoryLimit: math.MaxInt64, From: "none"},
		},
		{
			name:      "GOGC off under the limit",
			cfg:       Config{GoGCPercent: -1},
			available: 24 * gib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: 2 * (gib + DefaultMaxIngestBytes), GCPercent: -1, From: "max_memory"},
		},
		{
			// (Validate refuses the configuration; were it applied anyway,
			// collections would not stop.)
			name:      "GOGC off without a limit is not applied",
			cfg:       Config{GoGCPercent: -1, GoMemoryLimit: -1},
			available: 24 * gib,
			getenv:    env(),
			want:      GoRuntime{MemoryLimit: math.MaxInt64, From: "none"},
			warn:      true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.cfg.GoRuntime(tc.available, tc.getenv)
			warnings := got.Warnings
			got.Warnings = nil
			if got.MemoryLimit != tc.want.MemoryLimit || got.GCPercent != tc.want.GCPercent || got.From != tc.want.From {
				t.Errorf("GoRuntime = %+v, want %+v", got, tc.want)
			}
			if (len(warnings) > 0) != tc.warn {
				t.Errorf("warnings %q, want some: %v", warnings, tc.warn)
			}
		})
	}
}

func TestGoRuntimeValidation(t *testing.T) {
	base := func() Config {
		return Config{Pipelines: map[string]PipelineConfig{"p": {Key: "k", Aggregates: map[string]AggregateConfig{"n": {Op: "count"}}}}}
	}
	c := base()
	c.GoMemoryLimit = 1 << 20
	if err := c.Validate(); err == nil {
		t.Error("a 1 MiB go_memory_limit was accepted")
	}
	c = base()
	c.GoGCPercent, c.GoMemoryLimit = -1, -1
	if err := c.Validate(); err == nil {
		t.Error("go_gc_percent and go_memory_limit both off was accepted")
	}
	c = base()
	c.GoGCPercent, c.GoMemoryLimit = -1, 1<<30
	if err := c.Validate(); err != nil {
		t.Errorf("go_gc_percent off under a limit: %v", err)
	}
}
