package actors_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

// A grain keeps its key's bytes in itself (a short key), and what keeps
// the key after the grain left memory copies it: here the index of when
// keys expire, which an event of a pipeline with a ttl sets. Kept by its
// key's string, a grain would stay in memory, state and all, until its
// key expired.
func TestGrainThatLeftMemoryIsNotKept(t *testing.T) {
	p, err := fold.Compile("p", fold.Spec{Key: "k", TTL: time.Hour, Aggregates: map[string]fold.AggregateSpec{"n": {Op: "count"}}})
	if err != nil {
		t.Fatal(err)
	}
	hs := start(t, openStore(t, t.TempDir()), actors.Config{Pipelines: map[string]*fold.Pipeline{"p": p}, Groups: 1, MaxActive: 1,
		MaxMemory: -1, IdleTimeout: time.Hour, CheckpointInterval: time.Hour})
	defer hs.shutdown()
	hs.ingest(event("a", "", 1))
	collected := actors.WatchGrain(hs.host, "p", "a")
	if collected == nil {
		t.Fatal("key a is not in memory after its event")
	}
	hs.ingest(event("b", "", 1)) // a is passivated, changed
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "key a to leave memory once stored", func() bool { return !actors.InMemory(hs.host, "p", "a") })
	eventually(t, "key a's grain to be collected", collected)
	if v, err := hs.host.Query(context.Background(), "p", "a"); err != nil || fmt.Sprint(v.Aggregates["n"]) != "1" {
		t.Fatalf("key a after it left memory: %+v, %v", v.Aggregates, err)
	}
}
