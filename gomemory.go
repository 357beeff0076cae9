package keyfold

import (
	"cmp"
	"math"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/keyfold/keyfold/persistence/embedded"
)

// The Go runtime's memory settings of a node's process.
//
// The Go collector starts a collection once the heap has grown by GOGC
// percent (100 by default) over what the last one left live. A node's live
// heap is large: the keys in memory (up to Config.MaxMemory) and the
// requests in flight. At a million keys it was ~0.7 GB, collected every few
// seconds, each collection walking millions of small objects: the collector
// took 12–17% of the node's CPU (BENCHMARKS.md, session 28). A node already
// has a memory budget, so keyfold serve gives the runtime a soft memory
// limit derived from it and a larger GOGC, as CockroachDB does for its
// Pebble-backed nodes (its --max-go-memory and --go-gc-percent): a small
// heap still collects at GOGC, a large one when it nears the limit, which
// makes the process's size predictable and its collections fewer.

// Go runtime defaults of keyfold serve.
const (
	// DefaultGoGCPercent is the GOGC keyfold serve sets while a memory
	// limit applies.
	DefaultGoGCPercent = 300
	// MinGoMemoryLimit is the smallest go_memory_limit a configuration may
	// set, and the least the derived default is.
	MinGoMemoryLimit = 256 << 20
)

// GoRuntime is what keyfold serve sets on the Go runtime for a node.
type GoRuntime struct {
	// MemoryLimit is the soft memory limit to set, in bytes
	// (debug.SetMemoryLimit; math.MaxInt64: none); 0 leaves the runtime's
	// (GOMEMLIMIT's, or none).
	MemoryLimit int64
	// GCPercent is the GOGC to set (debug.SetGCPercent; negative: off); 0
	// leaves the runtime's (the GOGC environment variable's, or 100).
	GCPercent int
	// From says where MemoryLimit comes from: "go_memory_limit",
	// "GOMEMLIMIT", "max_memory" (derived), or "none".
	From string
}

// GoRuntime returns the Go runtime settings for c's process (see
// Config.GoMemoryLimit and Config.GoGCPercent). available is the memory the
// process may use, in bytes (0: unknown); getenv reads the environment.
func (c Config) GoRuntime(available uint64, getenv func(string) string) GoRuntime {
	var r GoRuntime
	envLimit := getenv("GOMEMLIMIT")
	switch {
	case c.GoMemoryLimit > 0:
		r.MemoryLimit, r.From = c.GoMemoryLimit, "go_memory_limit"
	case c.GoMemoryLimit < 0:
		r.MemoryLimit, r.From = math.MaxInt64, "none"
	case envLimit != "":
		r.From = "GOMEMLIMIT"
		if envLimit == "off" {
			r.From = "none"
		}
	default:
		r.MemoryLimit, r.From = c.derivedGoMemoryLimit(available), "max_memory"
	}
	limited := r.From != "none"
	switch {
	case c.GoGCPercent > 0:
		r.GCPercent = c.GoGCPercent
	case c.GoGCPercent < 0:
		if limited { // (Validate refuses it otherwise: nothing would collect)
			r.GCPercent = -1
		}
	case getenv("GOGC") != "":
		// the environment's
	case limited:
		r.GCPercent = DefaultGoGCPercent
	}
	return r
}

// derivedGoMemoryLimit is the default soft memory limit: twice what the
// node keeps live at most (its keys and its requests in flight), within
// what the process may use beside the embedded store's block cache.
func (c Config) derivedGoMemoryLimit(available uint64) int64 {
	ingest := cmp.Or(c.MaxIngestBytes, max(DefaultMaxIngestBytes, c.largestIngest()))
	limit := 2 * (c.maxMemory() + ingest)
	if available > 0 {
		var blockCache int64
		if c.Store == nil && c.Redis == "" {
			blockCache = cmp.Or(c.StoreCacheMemory, embedded.DefaultCacheSize)
		}
		limit = min(limit, int64(0.9*float64(available))-int64(1.15*float64(blockCache)))
	}
	return max(limit, MinGoMemoryLimit)
}

// ApplyGoRuntime sets the Go runtime's memory limit and GOGC for c's
// process, as keyfold serve does (GoRuntime, with the memory the process's
// cgroup allows, else the machine's), and returns what it decided. New
// never calls it: a program that embeds a Node owns its process's runtime,
// and may call it if the node is what the process is for.
func (c Config) ApplyGoRuntime() GoRuntime {
	available, err := memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem)()
	if err != nil {
		available = 0
	}
	r := c.GoRuntime(available, os.Getenv)
	if r.MemoryLimit != 0 {
		debug.SetMemoryLimit(r.MemoryLimit)
	}
	if r.GCPercent != 0 {
		debug.SetGCPercent(r.GCPercent)
	}
	return r
}
