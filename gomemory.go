package keyfold

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/embedded"
)

// The Go runtime's memory settings of a node's process.
//
// The Go collector starts a collection once the heap has grown by GOGC
// percent (100 by default) over what the last one left live. A node's live
// heap is large: the keys in memory (up to Config.MaxMemory) and the
// requests in flight. At a million keys it was ~0.7 GB, collected every few
// seconds, each collection walking millions of small objects: the collector
// took 12–13% of the node's CPU (BENCHMARKS.md, session 28). A node already
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
	// Warnings are what an operator should hear about these settings.
	Warnings []string
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
		// (A malformed GOMEMLIMIT stops the runtime before this runs.)
		r.From = "GOMEMLIMIT"
		if envLimit == "off" {
			r.From = "none"
		}
	default:
		r.MemoryLimit, r.From = c.derivedGoMemoryLimit(available, &r.Warnings), "max_memory"
	}
	limited := r.From != "none"
	envGC, envGCSet := getenv("GOGC"), false
	if envGC != "" {
		// As the runtime reads it: "off", or a number; anything else it
		// takes for 100, so it counts as unset here.
		if n, err := strconv.Atoi(envGC); err == nil || envGC == "off" {
			envGCSet = true
			if (envGC == "off" || n < 0) && !limited && c.GoGCPercent == 0 {
				r.Warnings = append(r.Warnings, "GOGC="+envGC+" without a memory limit: nothing starts a collection, the heap grows without bound")
			}
		} else {
			r.Warnings = append(r.Warnings, fmt.Sprintf("GOGC=%q is not a number nor off (the runtime takes it for 100): ignored", envGC))
		}
	}
	switch {
	case c.GoGCPercent > 0:
		r.GCPercent = c.GoGCPercent
	case c.GoGCPercent < 0:
		if limited { // (Validate refuses it with go_memory_limit -1)
			r.GCPercent = -1
		} else {
			r.Warnings = append(r.Warnings, "go_gc_percent -1 (off) ignored: no memory limit applies, and nothing would start a collection")
		}
	case envGCSet:
		// the environment's
	case limited:
		r.GCPercent = DefaultGoGCPercent
	}
	return r
}

// derivedGoMemoryLimit is the default soft memory limit: twice what the
// node keeps live at most (its keys and its requests in flight), plus the
// store's memory when the runtime counts it, within what the process may
// use beside the memory the runtime does not count (nodeMemory). Problems
// are added to warnings.
func (c Config) derivedGoMemoryLimit(available uint64, warnings *[]string) int64 {
	offHeap, storeGo := c.nodeMemory()
	live := float64(c.maxMemory()) + float64(c.maxIngestBytes()) + float64(storeGo)
	limit := 2*live - float64(storeGo) // (the store's memory is not live heap that doubles)
	if available > 0 {
		room := 0.9*float64(available) - float64(offHeap)
		if room < live {
			*warnings = append(*warnings, fmt.Sprintf(
				"the memory available (%d MiB, 90%% of it less %d MiB outside the Go heap) is less than the node may keep live (%d MiB: max_memory, max_ingest_bytes and the store): the collector will run often; lower max_memory",
				available>>20, offHeap>>20, int64(live)>>20))
		}
		limit = min(limit, room)
	}
	if limit < MinGoMemoryLimit {
		return MinGoMemoryLimit
	}
	if limit >= math.MaxInt64/2 { // (saturated: far beyond any machine)
		return math.MaxInt64 / 2
	}
	return int64(limit)
}

// nodeMemory returns the memory of c's node that the Go runtime's limit does
// not count (offHeap: the snapshot cache's entries, which fastcache maps
// outside the heap, and with cgo the block caches of the embedded store's
// two Pebbles, with 15% for their slop, and their memtables) and the
// store's memory it does count (storeGo: those of Pebble's without cgo).
func (c Config) nodeMemory() (offHeap, storeGo int64) {
	offHeap = actors.CacheEntryMemory(c.maxMemory(), c.CacheMemory)
	if c.Store == nil && c.Redis == "" {
		// The store's Pebble and its id index's: two block caches, two
		// memtables each.
		store := int64(1.15*float64(cmp.Or(c.StoreCacheMemory, embedded.DefaultCacheSize)+embedded.IDIndexCacheSize)) + 4*embedded.DefaultMemTableSize
		if cgoEnabled {
			offHeap += store
		} else {
			storeGo = store
		}
	}
	return offHeap, storeGo
}

// availableMemory is the memory the process may use: the smaller of its
// cgroup's limit and the machine's memory, whichever are known (0: none).
func availableMemory() uint64 {
	var avail uint64
	for _, p := range []memlimit.Provider{memlimit.FromCgroup, memlimit.FromSystem} {
		if n, err := p(); err == nil && n > 0 && (avail == 0 || n < avail) {
			avail = n
		}
	}
	return avail
}

// ApplyGoRuntime sets the Go runtime's memory limit and GOGC for c's
// process, as keyfold serve does (GoRuntime, with the memory the process's
// cgroup allows or the machine's, the smaller), and returns what it
// decided. New never calls it: a program that embeds a Node owns its
// process's runtime, and may call it if the node is what the process is
// for.
func (c Config) ApplyGoRuntime() GoRuntime {
	r := c.GoRuntime(availableMemory(), os.Getenv)
	if r.MemoryLimit != 0 {
		debug.SetMemoryLimit(r.MemoryLimit)
	}
	if r.GCPercent != 0 {
		debug.SetGCPercent(r.GCPercent)
	}
	return r
}
