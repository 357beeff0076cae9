// Package metrics exposes a node's counters as Prometheus metrics, on a
// registry the caller provides (never the global one).
package metrics
