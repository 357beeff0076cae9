package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/cluster"
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterHost registers the host's counters, read from stats at each
// scrape, on reg.
func RegisterHost(reg prometheus.Registerer, stats func() actors.Stats) error {
	counter := func(name, help string, v func(actors.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyfold", Name: name, Help: help},
			func() float64 { return v(stats()) })
	}
	gauge := func(name, help string, v func(actors.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "keyfold", Name: name, Help: help},
			func() float64 { return v(stats()) })
	}
	for _, c := range []prometheus.Collector{
		counter("events_applied_total", "Events applied to keys, duplicates included.", func(s actors.Stats) float64 { return float64(s.Events) }),
		counter("duplicates_total", "Events skipped because their id was already applied to the key, as the ingest replies reported them (a replay does not count a logged duplicate again).", func(s actors.Stats) float64 { return float64(s.Duplicates) }),
		counter("commits_total", "Group commits: synced appends to the key-group logs.", func(s actors.Stats) float64 { return float64(s.Commits) }),
		counter("checkpoints_total", "Key-group checkpoints written.", func(s actors.Stats) float64 { return float64(s.Checkpoints) }),
		counter("snapshots_written_total", "Key snapshots written by checkpoints: the keys changed since their last one (with many more keys than events per checkpoint, about one per event).", func(s actors.Stats) float64 { return float64(s.Snapshots) }),
		counter("replayed_records_total", "Log records replayed by key-group take-overs (at start and after a loss).", func(s actors.Stats) float64 { return float64(s.Replayed) }),
		counter("activations_total", "Key actors activated.", func(s actors.Stats) float64 { return float64(s.Activations) }),
		counter("passivations_total", "Key actors passivated.", func(s actors.Stats) float64 { return float64(s.Passivated) }),
		counter("actors_spawned_total", "Actors spawned to run keys; an activation reuses the actor of a passivated key when one is idle.", func(s actors.Stats) float64 { return float64(s.Spawned) }),
		gauge("idle_actors", "Actors of passivated keys waiting for the next activations.", func(s actors.Stats) float64 { return float64(s.IdleActors) }),
		counter("dispatch_overflows_total", "Key actors' mailbox runs that found the workers' queue full and got a goroutine of their own (bursts of messages to many keys).", func(s actors.Stats) float64 { return float64(s.Overflows) }),
		counter("key_groups_lost_total", "Key groups lost after a failed or fenced store write, then taken over again.", func(s actors.Stats) float64 { return float64(s.GroupsLost) }),
		gauge("key_groups_unavailable", "Key groups not served now: being recovered or taken over again.", func(s actors.Stats) float64 { return float64(s.GroupsUnavailable) }),
		gauge("active_keys", "Key actors in memory.", func(s actors.Stats) float64 { return float64(s.ActiveKeys) }),
		gauge("resident_keys", "Keys held in memory without an actor (passivated, within max_memory).", func(s actors.Stats) float64 { return float64(s.ResidentKeys) }),
		gauge("resident_bytes", "Estimated memory of the keys held without an actor.", func(s actors.Stats) float64 { return float64(s.ResidentBytes) }),
		gauge("cached_keys", "Entries of the snapshot cache's index: keys that left memory whose state it keeps packed, within cache_memory (it forgets entries whose space it reused lazily, and keys back in memory keep theirs until they leave again: up to twice the keys it can return).", func(s actors.Stats) float64 { return float64(s.CachedKeys) }),
		gauge("cache_bytes", "Memory of the snapshot cache (outside the Go heap).", func(s actors.Stats) float64 { return float64(s.CacheBytes) }),
		counter("activations_cached_total", "Key actors activated from the snapshot cache, without a store read.", func(s actors.Stats) float64 { return float64(s.CacheHits) }),
		counter("activations_cache_misses_total", "Key actors activated from the store after the snapshot cache did not have them.", func(s actors.Stats) float64 { return float64(s.CacheMisses) }),
		counter("activations_resident_total", "Key actors activated from memory (the resident tier), without a store read.", func(s actors.Stats) float64 { return float64(s.Unparked) }),
		gauge("log_bytes_unchecked", "Bytes of the key-group logs above their checkpoints: what a restart would replay (about checkpoint_max_bytes at most).", func(s actors.Stats) float64 { return float64(s.LoggedBytes) }),
		gauge("dirty_keys", "Keys changed since their last snapshot (spilled ones included).", func(s actors.Stats) float64 { return float64(s.DirtyKeys) }),
		gauge("spilled_keys", "Changed keys that left memory packed (the spill) until their key group's next checkpoint.", func(s actors.Stats) float64 { return float64(s.SpilledKeys) }),
		gauge("spilled_bytes", "Memory of the spill (outside the Go heap's pointers; part of resident_bytes).", func(s actors.Stats) float64 { return float64(s.SpilledBytes) }),
		counter("spills_total", "Changed keys that went to the spill.", func(s actors.Stats) float64 { return float64(s.Spills) }),
		gauge("id_index_in_use", "1 while checkpoints write remembered ids to the store's id index and keep only their fingerprints in snapshots (while keys leave memory for want of room), else 0.", func(s actors.Stats) float64 {
			if s.IndexingIDs {
				return 1
			}
			return 0
		}),
		counter("id_lookups_total", "Events whose id was looked up in the store's id index: their key held the fingerprint of an id it applied before it was restored.", func(s actors.Stats) float64 { return float64(s.IDLookups) }),
		counter("activations_new_total", "Key actors activated as new without a store read: their key group's filter of stored keys does not hold them.", func(s actors.Stats) float64 { return float64(s.NewKeys) }),
		gauge("stored_keys_filter_bytes", "Memory of the key groups' filters of stored keys (about 1.5 bytes a stored key).", func(s actors.Stats) float64 { return float64(s.FilterBytes) }),
		counter("activations_spilled_total", "Key actors activated from the spill, without a store read.", func(s actors.Stats) float64 { return float64(s.Unspills) }),
		counter("timers_fired_total", "Keys woken because a window timer was due.", func(s actors.Stats) float64 { return float64(s.TimersFired) }),
		pipelineCollector{stats},
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// DiskStats are the state of the embedded store's filesystem.
type DiskStats struct {
	Full         bool  // writes are refused for lack of space
	FreeBytes    int64 // space available on the filesystem
	ReserveBytes int64 // the free space the store keeps (negative: no check)
	// FlushedBytes and CompactedBytes are the bytes of the tables the
	// store's memtable flushes and compactions wrote since it opened.
	FlushedBytes, CompactedBytes int64
	// UnmappedTables counts the openings of tables the store read by
	// pread because the kernel refused to map them (vm.max_map_count).
	UnmappedTables int64
}

// RegisterDisk registers the embedded store's disk metrics, read from
// stats once at each scrape (each read looks at the filesystem), on reg.
func RegisterDisk(reg prometheus.Registerer, stats func() DiskStats) error {
	return reg.Register(diskCollector{stats})
}

var (
	diskFullDesc = prometheus.NewDesc("keyfold_store_disk_full",
		"1 while the embedded store refuses writes for lack of disk space (ingest answers 503), else 0.", nil, nil)
	diskFreeDesc = prometheus.NewDesc("keyfold_store_disk_free_bytes",
		"Space available on the embedded store's filesystem.", nil, nil)
	diskReserveDesc = prometheus.NewDesc("keyfold_store_disk_reserve_bytes",
		"Free space the embedded store keeps: ingest is refused below it.", nil, nil)
	storeFlushedDesc = prometheus.NewDesc("keyfold_store_flushed_bytes_total",
		"Bytes of the tables the embedded store's memtable flushes wrote (checkpoints' snapshots and ids, once each).", nil, nil)
	storeCompactedDesc = prometheus.NewDesc("keyfold_store_compacted_bytes_total",
		"Bytes of the tables the embedded store's compactions wrote: what it rewrote of its flushed tables (compared with flushed_bytes_total, its write amplification).", nil, nil)
	storeUnmappedDesc = prometheus.NewDesc("keyfold_store_unmapped_tables_total",
		"Openings of tables for point reads that the kernel refused to map in the embedded store (raise vm.max_map_count): those tables are read by pread, a system call per block read.", nil, nil)
)

// diskCollector reports the embedded store's disk metrics from one read of
// its stats per scrape.
type diskCollector struct{ stats func() DiskStats }

func (c diskCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- diskFullDesc
	ch <- diskFreeDesc
	ch <- diskReserveDesc
	ch <- storeFlushedDesc
	ch <- storeCompactedDesc
	ch <- storeUnmappedDesc
}

func (c diskCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.stats()
	full := 0.0
	if d.Full {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(diskFullDesc, prometheus.GaugeValue, full)
	ch <- prometheus.MustNewConstMetric(diskFreeDesc, prometheus.GaugeValue, float64(d.FreeBytes))
	ch <- prometheus.MustNewConstMetric(diskReserveDesc, prometheus.GaugeValue, float64(d.ReserveBytes))
	ch <- prometheus.MustNewConstMetric(storeFlushedDesc, prometheus.CounterValue, float64(d.FlushedBytes))
	ch <- prometheus.MustNewConstMetric(storeCompactedDesc, prometheus.CounterValue, float64(d.CompactedBytes))
	ch <- prometheus.MustNewConstMetric(storeUnmappedDesc, prometheus.CounterValue, float64(d.UnmappedTables))
}

// RegisterCluster registers a member's cluster counters, read from stats at
// each scrape, on reg (a node alone: one member owning every group).
func RegisterCluster(reg prometheus.Registerer, stats func() cluster.Stats) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "keyfold", Subsystem: "cluster", Name: "members", Help: "Live cluster members this node sees."},
			func() float64 { return float64(stats().Members) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "keyfold", Subsystem: "cluster", Name: "key_groups_owned", Help: "Key groups placement gives this node."},
			func() float64 { return float64(stats().GroupsOwned) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyfold", Subsystem: "cluster", Name: "key_groups_moved_total", Help: "Key groups whose owner changed, over the member lists this node saw."},
			func() float64 { return float64(stats().GroupsMoved) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyfold", Subsystem: "cluster", Name: "events_forwarded_total", Help: "Events this node accepted and sent to the owner of their key group."},
			func() float64 { return float64(stats().EventsForwarded) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyfold", Subsystem: "cluster", Name: "events_received_total", Help: "Events other members forwarded to this node."},
			func() float64 { return float64(stats().EventsReceived) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "keyfold", Subsystem: "cluster", Name: "events_rerouted_total", Help: "Events routed again because their owner did not serve their key group yet (nothing of them was logged)."},
			func() float64 { return float64(stats().EventsRerouted) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

var (
	pipelineEventsDesc = prometheus.NewDesc("keyfold_pipeline_events_applied_total",
		"Events applied to keys, duplicates included, by pipeline.", []string{"pipeline"}, nil)
	pipelineDupsDesc = prometheus.NewDesc("keyfold_pipeline_duplicates_total",
		"Events skipped because their id was already applied to the key, by pipeline.", []string{"pipeline"}, nil)
	pipelineLateDesc = prometheus.NewDesc("keyfold_pipeline_late_events_total",
		"Events too late for every window they belonged to (dropped from the windows), by pipeline.", []string{"pipeline"}, nil)
	pipelineWindowLateDesc = prometheus.NewDesc("keyfold_pipeline_window_late_events_total",
		"Events too late for at least one window of the name they fell in (other windows may have taken them), by pipeline and window.", []string{"pipeline", "window"}, nil)
	pipelineExpiredDesc = prometheus.NewDesc("keyfold_pipeline_keys_expired_total",
		"Keys deleted because they received no event for their pipeline's ttl, by pipeline.", []string{"pipeline"}, nil)
	pipelineEmittedDesc = prometheus.NewDesc("keyfold_pipeline_outputs_emitted_total",
		"Window results emitted by keys (a replay emits its results again, with the same ids), by pipeline.", []string{"pipeline"}, nil)
	pipelineHandlerFailuresDesc = prometheus.NewDesc("keyfold_pipeline_handler_failures_total",
		"Calls of the pipeline's Go handler that returned an error or panicked (each emitted a dead letter; a replay counts its own again), by pipeline.", []string{"pipeline"}, nil)
	pipelineCallsDesc = prometheus.NewDesc("keyfold_pipeline_calls_total",
		"Requests to the pipeline's Go handler (Node.Call) its keys answered, logged (a replay counts its own again) or read-only, by pipeline.", []string{"pipeline"}, nil)
	pipelineCallFailuresDesc = prometheus.NewDesc("keyfold_pipeline_call_failures_total",
		"Requests to the pipeline's Go handler that it failed (the caller got the error; the key is unchanged), by pipeline.", []string{"pipeline"}, nil)

	joinResultsDesc = prometheus.NewDesc("keyfold_join_results_total",
		"Join results that joined two events (a replay emits its results again, with the same ids), by join.", []string{"join"}, nil)
	joinUnmatchedDesc = prometheus.NewDesc("keyfold_join_unmatched_total",
		"Join results of one event with the other side empty (left and outer joins), by join.", []string{"join"}, nil)
	joinLateDesc = prometheus.NewDesc("keyfold_join_late_events_total",
		"Events too late to be joined (behind the join's watermark by more than its allowed_lateness), by join.", []string{"join"}, nil)
	joinBufferedDesc = prometheus.NewDesc("keyfold_join_buffered_events",
		"Events the join's keys held in this node's memory buffer now, by join.", []string{"join"}, nil)
)

// pipelineCollector reports the per-pipeline counters, read at each scrape.
type pipelineCollector struct{ stats func() actors.Stats }

func (c pipelineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pipelineEventsDesc
	ch <- pipelineDupsDesc
	ch <- pipelineLateDesc
	ch <- pipelineWindowLateDesc
	ch <- pipelineEmittedDesc
	ch <- pipelineExpiredDesc
	ch <- pipelineHandlerFailuresDesc
	ch <- pipelineCallsDesc
	ch <- pipelineCallFailuresDesc
	ch <- joinResultsDesc
	ch <- joinUnmatchedDesc
	ch <- joinLateDesc
	ch <- joinBufferedDesc
}

func (c pipelineCollector) Collect(ch chan<- prometheus.Metric) {
	for name, ps := range c.stats().Pipelines {
		if ps.Join {
			ch <- prometheus.MustNewConstMetric(joinResultsDesc, prometheus.CounterValue, float64(ps.Emitted-ps.Unmatched), name)
			ch <- prometheus.MustNewConstMetric(joinUnmatchedDesc, prometheus.CounterValue, float64(ps.Unmatched), name)
			ch <- prometheus.MustNewConstMetric(joinLateDesc, prometheus.CounterValue, float64(ps.Late), name)
			ch <- prometheus.MustNewConstMetric(joinBufferedDesc, prometheus.GaugeValue, float64(ps.Buffered), name)
			continue
		}
		ch <- prometheus.MustNewConstMetric(pipelineEventsDesc, prometheus.CounterValue, float64(ps.Events), name)
		ch <- prometheus.MustNewConstMetric(pipelineDupsDesc, prometheus.CounterValue, float64(ps.Duplicates), name)
		ch <- prometheus.MustNewConstMetric(pipelineLateDesc, prometheus.CounterValue, float64(ps.Late), name)
		for window, n := range ps.LateByWindow {
			ch <- prometheus.MustNewConstMetric(pipelineWindowLateDesc, prometheus.CounterValue, float64(n), name, window)
		}
		ch <- prometheus.MustNewConstMetric(pipelineEmittedDesc, prometheus.CounterValue, float64(ps.Emitted), name)
		ch <- prometheus.MustNewConstMetric(pipelineExpiredDesc, prometheus.CounterValue, float64(ps.Expired), name)
		ch <- prometheus.MustNewConstMetric(pipelineHandlerFailuresDesc, prometheus.CounterValue, float64(ps.HandlerFailures), name)
		ch <- prometheus.MustNewConstMetric(pipelineCallsDesc, prometheus.CounterValue, float64(ps.Calls), name)
		ch <- prometheus.MustNewConstMetric(pipelineCallFailuresDesc, prometheus.CounterValue, float64(ps.CallFailures), name)
	}
}

// HTTP instruments an HTTP handler: requests by route pattern, method and
// status, and their durations by route.
type HTTP struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewHTTP registers the HTTP instruments on reg.
func NewHTTP(reg prometheus.Registerer) (*HTTP, error) {
	h := &HTTP{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyfold", Subsystem: "http", Name: "requests_total",
			Help: "HTTP requests by route, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "keyfold", Subsystem: "http", Name: "request_duration_seconds",
			Help:    "HTTP request latency by route, ingest included (it waits for the fsync).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5ms … 16s
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{h.requests, h.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Wrap instruments next. Routes are the mux patterns (r.Pattern), so label
// values stay bounded whatever the URLs.
func (h *HTTP) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" || route == "/" {
			route = "unmatched"
		}
		h.requests.WithLabelValues(route, r.Method, strconv.Itoa(sw.status)).Inc()
		h.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// Flush passes on flushes (the Server-Sent Events stream needs them).
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer (write
// deadlines, flushes).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
