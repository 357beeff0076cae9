// Package servicetest runs real keyfold nodes in a test process, for the
// tests of the transports, the CLI and the node itself.
package servicetest

import (
	"context"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
)

// Config parses a YAML configuration and points it at a new temporary data
// directory, with 16 key groups (quick to recover) and no listeners.
func Config(t testing.TB, yaml string) keyfold.Config {
	t.Helper()
	cfg, err := keyfold.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = t.TempDir()
	if cfg.KeyGroups == 0 {
		cfg.KeyGroups = 16
	}
	return cfg
}

// Start runs a node on cfg until it is ready; the caller closes it and
// reads Run's error from the channel.
func Start(t testing.TB, cfg keyfold.Config) (*keyfold.Node, chan error) {
	t.Helper()
	n, err := keyfold.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- n.Run(context.Background()) }()
	select {
	case <-n.Ready():
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("node not ready after 20s")
	}
	return n, errc
}

// Run starts a node on cfg that is closed, and its Run checked, when the
// test ends.
func Run(t testing.TB, cfg keyfold.Config) *keyfold.Node {
	t.Helper()
	n, errc := Start(t, cfg)
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return n
}

// DescribedYAML configures a pipeline that uses every setting a pipeline
// description (gRPC ListPipelines, GET /v1/pipelines) reports, and one that
// uses none but its key and an aggregate: the tests of both transports
// describe these.
const DescribedYAML = `
pipelines:
  logins:
    key: user_id
    time: ts
    id: event_id
    ttl: 720h
    out_of_orderness: 5s
    allowed_lateness: 1m
    aggregates:
      total:  { op: count }
      failed: { op: count, where: "type == 'login_failed'" }
      amount: { op: sum, field: amount }
    windows:
      per_minute: { type: tumbling, size: 1m, aggregates: [total, amount] }
      last_hour:  { type: sliding, size: 1h, slide: 5m, aggregates: [total] }
      sessions:   { type: session, gap: 30m }
    patterns:
      brute_force:  { where: "type == 'login_failed'", count: 3, within: 5m }
      fail_then_ok: { sequence: ["type == 'login_failed'", "type == 'login_ok'"], within: 10m }
      no_recovery:  { after: "type == 'login_failed'", absent: "type == 'login_ok'", within: 15m }
  clicks:
    key: page
    aggregates:
      hits: { op: count }
`

// JoinsYAML configures two pipelines and a join of each kind (interval,
// sliding window, session window, temporal), with the settings a join
// description (gRPC ListPipelines' joins, GET /v1/pipelines' joins)
// reports: the tests of both transports describe these.
const JoinsYAML = `
pipelines:
  orders:   { key: order_id, time: ts, id: event_id }
  payments: { key: order_id, time: ts, id: event_id }
joins:
  paid:
    type: interval
    mode: left
    left:  { pipeline: orders,   fields: [amount] }
    right: { pipeline: payments, fields: [amount, method] }
    lower: 0s
    upper: 1h
    allowed_lateness: 1m
  per_hour:
    type: window
    window: sliding
    size: 1h
    slide: 15m
    left:  { pipeline: orders }
    right: { pipeline: payments }
  sessions:
    type: window
    window: session
    mode: outer
    gap: 10m
    out_of_orderness: 5s
    left:  { pipeline: orders }
    right: { pipeline: payments }
  rated:
    type: temporal
    left:  { pipeline: payments }
    right: { pipeline: orders, fields: [amount] }
    idle_timeout: 1m
`
