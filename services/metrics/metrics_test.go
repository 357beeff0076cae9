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
			got[id] = m.GetCounter().GetValue()
		}
	}
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
