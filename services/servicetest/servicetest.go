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
