package fold_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
)

func sketchPipeline(t *testing.T) *fold.Pipeline {
	t.Helper()
	p, err := fold.Compile("p", fold.Spec{Key: "k", DedupWindow: time.Hour, Aggregates: map[string]fold.AggregateSpec{
		"users":   {Op: "distinct", Field: "user"},
		"latency": {Op: "quantiles", Field: "ms"},
		"slow":    {Op: "quantiles", Field: "ms", Where: "ms > 100"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func applyJSON(t *testing.T, p *fold.Pipeline, s *fold.State, raw string) {
	t.Helper()
	ev, err := p.Prepare([]byte(raw))
	if err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	p.Apply(s, ev, 1)
}

// TestDistinctAccuracy: the distinct estimate is within 2% of the exact
// count at 100,000 distinct values (and exact-ish when small), for several
// seeds; duplicates do not count and numbers name values as keys do.
func TestDistinctAccuracy(t *testing.T) {
	p := sketchPipeline(t)
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 9))
		var s fold.State
		seen := map[string]bool{}
		for len(seen) < 100_000 {
			u := fmt.Sprintf("user-%d", rng.Uint64())
			if rng.IntN(4) == 0 && len(seen) > 0 { // a repeat of some earlier value
				u = fmt.Sprintf("user-%d", seed)
			}
			seen[u] = true
			applyJSON(t, p, &s, fmt.Sprintf(`{"k":"a","user":%q,"ms":1}`, u))
			if n := len(seen); n == 10 || n == 1000 {
				got := p.Aggregates(&s)["users"].(uint64)
				if math.Abs(float64(got)-float64(n))/float64(n) > 0.02 {
					t.Errorf("seed %d: %d distinct values estimated as %d", seed, n, got)
				}
			}
		}
		got := p.Aggregates(&s)["users"].(uint64)
		if rel := math.Abs(float64(got)-100_000) / 100_000; rel > 0.02 {
			t.Errorf("seed %d: 100,000 distinct values estimated as %d (%.2f%% off)", seed, got, 100*rel)
		} else {
			t.Logf("seed %d: 100,000 distinct estimated as %d (%.2f%% off)", seed, got, 100*rel)
		}
	}
	var s fold.State
	for _, u := range []string{`"1"`, `1`, `1.0`, `"x"`, `"x"`} {
		applyJSON(t, p, &s, `{"k":"a","user":`+u+`}`)
	}
	if got := p.Aggregates(&s)["users"]; got != uint64(2) {
		t.Errorf("distinct of 1, \"1\", 1.0, x, x = %v, want 2", got)
	}
	if _, err := p.Prepare([]byte(`{"k":"a","user":{"id":1}}`)); err == nil {
		t.Error("an object as a distinct value was accepted")
	}
}

// TestQuantilesAccuracy: every reported quantile is within the sketch's 1%
// relative accuracy of the exact value at that rank, on skewed data.
func TestQuantilesAccuracy(t *testing.T) {
	p := sketchPipeline(t)
	rng := rand.New(rand.NewPCG(7, 7))
	var s fold.State
	var values []float64
	for range 50_000 {
		v := math.Round(math.Exp(rng.NormFloat64()*1.2+3)*1000) / 1000 // log-normal, 0.1 … 2,000 ms
		values = append(values, v)
		applyJSON(t, p, &s, fmt.Sprintf(`{"k":"a","user":"u","ms":%v}`, v))
	}
	slices.Sort(values)
	got := p.Aggregates(&s)["latency"].(map[string]any)
	for _, q := range fold.Quantiles {
		exact := values[int(q.Q*float64(len(values)-1))]
		est := got[q.Name].(float64)
		if rel := math.Abs(est-exact) / exact; rel > fold.QuantileAccuracy*1.001 {
			t.Errorf("%s: estimated %v, exact %v (%.3f%% off, want ≤ 1%%)", q.Name, est, exact, 100*rel)
		}
	}
	// The filtered one only saw values above 100.
	if slow := p.Aggregates(&s)["slow"].(map[string]any); slow["p50"].(float64) <= 100*(1-fold.QuantileAccuracy) {
		t.Errorf("slow p50 = %v, want above 100", slow["p50"])
	}
	var empty fold.State
	if v := p.Aggregates(&empty)["latency"]; v != nil {
		t.Errorf("quantiles of nothing = %v, want null", v)
	}
	if _, err := p.Prepare([]byte(`{"k":"a","ms":"fast"}`)); err == nil {
		t.Error("a string for quantiles was accepted")
	}
}

// TestSketchesSurviveSnapshots: a state with sketches restores to the same
// estimates, through both snapshot forms, and keeps folding the same.
func TestSketchesSurviveSnapshots(t *testing.T) {
	p := sketchPipeline(t)
	var s fold.State
	for i := range 5000 {
		applyJSON(t, p, &s, fmt.Sprintf(`{"k":"a","user":"u%d","ms":%d}`, i%3000, i%700))
	}
	r, b := roundTrip(t, p, &s)
	parts, err := p.SnapshotParts(&s, 0)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := p.RestoreParts(mustCore(t, parts), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*fold.State{&s, &r, &r2} {
		applyJSON(t, p, st, `{"k":"a","user":"new","ms":5000}`)
	}
	want := fmt.Sprint(p.Aggregates(&s))
	for i, st := range []*fold.State{&r, &r2} {
		if got := fmt.Sprint(p.Aggregates(st)); got != want {
			t.Errorf("restore %d: %s, want %s", i, got, want)
		}
	}
	t.Logf("snapshot of a key with two sketches: %d bytes", len(b))
}
