// Package foldtest holds what tests and benchmarks of several packages share
// about pipelines.
package foldtest

import "github.com/keyfold/keyfold/actors/fold"

// BenchSpec is the login pipeline of examples/bench.yaml, keyed by user_id
// with event_id as its id: the five aggregates the benchmarks load
// (BENCHMARKS.md).
func BenchSpec() fold.Spec {
	return fold.Spec{Key: "user_id", ID: "event_id", Aggregates: map[string]fold.AggregateSpec{
		"total":   {Op: "count"},
		"failed":  {Op: "count", Where: "type == 'login_failed'"},
		"amount":  {Op: "sum", Field: "amount"},
		"biggest": {Op: "max", Field: "amount"},
		"country": {Op: "last", Field: "geo.country"},
	}}
}
