package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/services/metrics"
)

// The per-pipeline late counters: events in no window, and per window.
func TestPipelineLateMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	stats := func() actors.Stats {
		return actors.Stats{Pipelines: map[string]actors.PipelineStats{
			"p": {Late: 1, LateByWindow: map[string]int64{"minute": 3, "session": 0}},
		}}
	}
	if err := metrics.RegisterHost(reg, stats); err != nil {
		t.Fatal(err)
	}
	got := gather(t, reg)
	for id, want := range map[string]float64{
		"keyfold_pipeline_late_events_total pipeline=p":                       1,
		"keyfold_pipeline_window_late_events_total pipeline=p window=minute":  3,
		"keyfold_pipeline_window_late_events_total pipeline=p window=session": 0,
	} {
		if v, ok := got[id]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", id, v, ok, want)
		}
	}
}

// The embedded store's disk metrics, from one read of its stats (a look at
// the filesystem) per scrape.
func TestDiskMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reads := 0
	stats := func() metrics.DiskStats {
		reads++
		return metrics.DiskStats{Full: true, FreeBytes: 10, ReserveBytes: 20, FlushedBytes: 30, CompactedBytes: 40, UnmappedTables: 2}
	}
	if err := metrics.RegisterDisk(reg, stats); err != nil {
		t.Fatal(err)
	}
	got := gather(t, reg)
	want := map[string]float64{
		"keyfold_store_disk_full":             1,
		"keyfold_store_disk_free_bytes":       10,
		"keyfold_store_disk_reserve_bytes":    20,
		"keyfold_store_flushed_bytes_total":   30,
		"keyfold_store_compacted_bytes_total": 40,
		"keyfold_store_unmapped_tables_total": 2,
	}
	if len(got) != len(want) {
		t.Fatalf("metrics %v, want %v", got, want)
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	if reads != 1 {
		t.Errorf("one scrape read the stats %d times, want 1", reads)
	}
}

// gather scrapes reg once: each sample's value (gauge or counter) by its
// name and its labels ("name l1=v1 l2=v2").
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			id := f.GetName()
			for _, l := range m.GetLabel() {
				id += " " + l.GetName() + "=" + l.GetValue()
			}
			got[id] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return got
}
