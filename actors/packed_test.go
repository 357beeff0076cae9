package actors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// compileAggs compiles pipeline p with ids and the given aggregates.
func compileAggs(t *testing.T, aggs map[string]fold.AggregateSpec) map[string]*fold.Pipeline {
	t.Helper()
	p, err := fold.Compile("p", fold.Spec{Key: "k", ID: "id", DedupWindow: time.Hour, Aggregates: aggs})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*fold.Pipeline{"p": p}
}

// storedSnapshot returns key's stored snapshot in pipeline p (one group).
func storedSnapshot(t *testing.T, s persistence.Store, key string) []byte {
	t.Helper()
	data, err := s.Get(context.Background(), 0, "p\x00"+key)
	if err != nil {
		t.Fatalf("snapshot of %s: %v", key, err)
	}
	return data
}

// A store that allows it holds a key of a pipeline with aggregates only in
// the packed form, and its pipeline's shape beside it; a key remembering
// more ids than a snapshot holds inline keeps the other form. After the
// pipeline's aggregates change (one renamed, one added, one removed, one of
// another op) a restarted host reads both by name: what kept its name and
// op keeps its value, ids stay remembered. And back: states packed by the
// new configuration read under the old one.
func TestPackedSnapshotsFollowConfigChanges(t *testing.T) {
	dir := t.TempDir()
	v1 := compileAggs(t, map[string]fold.AggregateSpec{
		"n": {Op: "count"}, "sum": {Op: "sum", Field: "v"}, "last": {Op: "last", Field: "v"}, "top": {Op: "max", Field: "v"},
	})
	v2 := compileAggs(t, map[string]fold.AggregateSpec{
		"n": {Op: "count"}, "total": {Op: "sum", Field: "v"}, "last": {Op: "last", Field: "v"}, "top": {Op: "min", Field: "v"}, "low": {Op: "min", Field: "v"},
	})
	cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour}
	store := openStore(t, dir)
	cfg.Pipelines = v1
	hs := start(t, store, cfg)
	hs.ingest(event("a", "a1", 5), event("a", "a2", 7))
	for i := range fold.InlineIDs + 4 { // more ids than a snapshot holds inline
		hs.ingest(event("many", fmt.Sprintf("m%d", i), i))
	}
	if err := hs.shutdown(); err != nil { // a clean shutdown checkpoints
		t.Fatal(err)
	}
	if !actors.IsPacked(storedSnapshot(t, store, "a")) {
		t.Fatal("a's snapshot is not packed")
	}
	if actors.IsPacked(storedSnapshot(t, store, "many")) {
		t.Fatal("the snapshot of a key with its ids in buckets is packed")
	}
	shape, err := store.Get(context.Background(), 0, actors.ShapeKey(v1["p"]))
	if err != nil {
		t.Fatalf("v1's shape: %v", err)
	}
	if want, _ := v1["p"].Shape(); string(shape) != string(want) {
		t.Fatalf("stored shape %x, want %x", shape, want)
	}

	cfg.Pipelines = v2
	hs = start(t, store, cfg)
	v := hs.query("a")
	if v.Seq != 2 || v.Aggregates["n"] != uint64(2) || string(v.Aggregates["last"].(json.RawMessage)) != "7" {
		t.Fatalf("a under v2 = %+v", v)
	}
	// Renamed, of another op, new: empty; removed: not shown.
	if v.Aggregates["total"] != float64(0) || v.Aggregates["top"] != nil || v.Aggregates["low"] != nil || v.Aggregates["sum"] != nil {
		t.Errorf("a under v2 = %+v", v)
	}
	if r := hs.ingest(event("a", "a1", 100)); r.Duplicates != 1 {
		t.Errorf("a's id a1 forgotten across the change: %+v", r)
	}
	hs.ingest(event("a", "a3", 1), event("b", "b1", 4))
	if v, n := hs.query("many"), fold.InlineIDs+4; v.Seq != uint64(n) || v.Aggregates["n"] != uint64(n) {
		t.Errorf("many under v2 = %+v", v)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(context.Background(), 0, actors.ShapeKey(v2["p"])); err != nil {
		t.Fatalf("v2's shape: %v", err)
	}

	cfg.Pipelines = v1 // back: a and b were packed by v2
	hs = start(t, store, cfg)
	defer hs.shutdown()
	if v := hs.query("a"); v.Seq != 3 || v.Aggregates["n"] != uint64(3) || string(v.Aggregates["last"].(json.RawMessage)) != "1" || v.Aggregates["sum"] != float64(0) || v.Aggregates["top"] != nil {
		t.Errorf("a back under v1 = %+v", v)
	}
	if v := hs.query("b"); v.Seq != 1 || v.Aggregates["top"] != nil || string(v.Aggregates["last"].(json.RawMessage)) != "4" {
		t.Errorf("b under v1 = %+v", v)
	}
	if r := hs.ingest(event("a", "a2", 1), event("a", "a3", 1)); r.Duplicates != 2 {
		t.Errorf("a's ids forgotten: %+v", r)
	}
}

// unpacked hides that a store allows packed snapshots, as a store of an
// older keyfold would be.
type unpacked struct{ persistence.Store }

// Snapshots written in the other form, by a host whose store does not
// allow packed ones (as before they existed), are read by one whose store
// does, which writes them packed at their next change.
func TestUnpackedSnapshotsStillRead(t *testing.T) {
	store := openStore(t, t.TempDir())
	cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour}
	hs := start(t, unpacked{store}, cfg)
	hs.ingest(event("a", "a1", 5), event("a", "a2", 7))
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	if actors.IsPacked(storedSnapshot(t, store, "a")) {
		t.Fatal("packed in a store that does not allow it")
	}
	hs = start(t, store, cfg)
	if v := hs.query("a"); v.Seq != 2 || v.Aggregates["sum"] != float64(12) {
		t.Errorf("a = %+v", v)
	}
	if r := hs.ingest(event("a", "a2", 1), event("a", "a3", 1)); r.Duplicates != 1 {
		t.Errorf("a's ids: %+v", r)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	if !actors.IsPacked(storedSnapshot(t, store, "a")) {
		t.Fatal("not packed once changed")
	}
}

// A packed snapshot whose shape its group does not hold (the store lost
// it) fails the key's activation with an error that says so, rather than
// reading the state by the wrong names.
func TestPackedSnapshotWithoutItsShape(t *testing.T) {
	store := openStore(t, t.TempDir())
	v1 := compileAggs(t, map[string]fold.AggregateSpec{"lost_n": {Op: "count"}, "lost_sum": {Op: "sum", Field: "v"}})
	cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour, Pipelines: v1}
	hs := start(t, store, cfg)
	hs.ingest(event("a", "a1", 5))
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gs, err := store.Claim(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Checkpoint(ctx, 0, gs.Epoch, persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: actors.ShapeKey(v1["p"])}}}); err != nil {
		t.Fatal(err)
	}
	cfg.Pipelines = compileAggs(t, map[string]fold.AggregateSpec{"lost_n": {Op: "count"}})
	hs = start(t, store, cfg)
	defer hs.shutdown()
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = hs.host.Query(qctx, "p", "a")
	if !errors.Is(err, actors.ErrUnavailable) || !causedBy(err, "which its group does not hold") {
		t.Fatalf("query of a key packed with a lost shape: %v", err)
	}
}

// causedBy reports whether err or an error it wraps says what.
func causedBy(err error, what string) bool {
	switch e := err.(type) {
	case nil:
		return false
	case interface{ Unwrap() []error }:
		for _, w := range e.Unwrap() {
			if causedBy(w, what) {
				return true
			}
		}
	}
	return strings.Contains(err.Error(), what) || causedBy(errors.Unwrap(err), what)
}

// A checkpoint that writes keys from the spill (changed keys that left
// memory packed) writes their pipeline's shape too: after a restart with
// an aggregate added, they are read by name.
func TestSpilledKeysStoredWithTheirShape(t *testing.T) {
	store := openStore(t, t.TempDir())
	v1 := compileAggs(t, map[string]fold.AggregateSpec{"sp_n": {Op: "count"}, "sp_sum": {Op: "sum", Field: "v"}})
	cfg := spillConfig(96 << 10)
	cfg.Groups = 1
	cfg.Pipelines = v1
	hs := start(t, store, cfg)
	const keys = 300
	for i := range keys {
		hs.ingest(event(fmt.Sprintf("k%d", i), "x", i))
	}
	eventually(t, "keys to be spilled", func() bool { return hs.host.Stats().SpilledKeys >= keys/2 })
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(context.Background(), 0, actors.ShapeKey(v1["p"])); err != nil {
		t.Fatalf("shape after a checkpoint of spilled keys: %v", err)
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	cfg.Pipelines = compileAggs(t, map[string]fold.AggregateSpec{"sp_n": {Op: "count"}, "sp_sum": {Op: "sum", Field: "v"}, "sp_new": {Op: "max", Field: "v"}})
	hs = start(t, store, cfg)
	defer hs.shutdown()
	for i := range keys {
		if v := hs.query(fmt.Sprintf("k%d", i)); v.Seq != 1 || v.Aggregates["sp_sum"] != float64(i) {
			t.Fatalf("k%d = %+v", i, v)
		}
	}
}

// One batched read holding a key packed under the pipeline's shape, one
// packed under an older shape and one stored as a message (its ids in
// buckets) decodes each as its own: ids and sums intact. In one group, and
// in several (the read asks each group for its keys, and the older shape
// of the group of the first key that names it).
func TestMixedSnapshotsInOneRead(t *testing.T) {
	for _, groups := range []uint32{1, 8} {
		t.Run(fmt.Sprint("groups=", groups), func(t *testing.T) {
			// (Aggregates named per run: shapes read once are kept for
			// the process, and each run must read its own.)
			n := fmt.Sprint("mx_n", groups)
			store := openStore(t, t.TempDir())
			v1 := compileAggs(t, map[string]fold.AggregateSpec{n: {Op: "count"}, "mx_sum": {Op: "sum", Field: "v"}})
			v2 := compileAggs(t, map[string]fold.AggregateSpec{n: {Op: "count"}, "mx_sum": {Op: "sum", Field: "v"}, "mx_max": {Op: "max", Field: "v"}})
			cfg := actors.Config{Groups: groups, CheckpointInterval: time.Hour, Pipelines: v1}
			hs := start(t, store, cfg)
			hs.ingest(event("a", "a1", 1), event("b", "b1", 1), event("x", "x1", 2))
			for i := range fold.InlineIDs + 4 {
				hs.ingest(event("many", fmt.Sprintf("m%d", i), 1))
			}
			if err := hs.shutdown(); err != nil {
				t.Fatal(err)
			}
			cfg.Pipelines = v2
			hs = start(t, store, cfg)
			hs.ingest(event("x", "x2", 3)) // x packed under v2's shape; a and b stay under v1's
			if err := hs.shutdown(); err != nil {
				t.Fatal(err)
			}
			hs = start(t, store, cfg)
			defer hs.shutdown()
			r := hs.ingest(event("a", "a1", 100), event("b", "b1", 100), event("x", "x2", 100), event("many", "m3", 100),
				event("a", "a2", 10), event("b", "b2", 20), event("x", "x3", 10), event("many", "m99", 10))
			if r.Duplicates != 4 {
				t.Errorf("duplicates %d, want 4: %+v", r.Duplicates, r)
			}
			for k, want := range map[string]float64{"a": 11, "b": 21, "x": 15, "many": float64(fold.InlineIDs + 14)} {
				if v := hs.query(k); v.Aggregates["mx_sum"] != want {
					t.Errorf("%s = %+v, want sum %v", k, v, want)
				}
			}
		})
	}
}

// Hosts on a real Redis: a store created before packed snapshots (format
// 1) gets messages and no shape; a new one (format 2) packed snapshots and
// their shape; both read after the pipeline's aggregates change.
func TestPackedSnapshotsOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := context.Background()
	rc.HSet(ctx, "old:meta", "format", "1", "groups", "1", "keylayout", "2")
	for _, c := range []struct {
		prefix string
		packed bool
	}{{"old", false}, {"new", true}} {
		s, err := redisstore.New(rc, redisstore.Options{Prefix: c.prefix})
		if err != nil {
			t.Fatal(err)
		}
		v1 := compileAggs(t, map[string]fold.AggregateSpec{"rd_n_" + c.prefix: {Op: "count"}, "rd_sum": {Op: "sum", Field: "v"}})
		cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour, Pipelines: v1}
		hs := start(t, s, cfg)
		hs.ingest(event("a", "a1", 5), event("a", "a2", 7))
		if err := hs.shutdown(); err != nil {
			t.Fatal(err)
		}
		if got := actors.IsPacked(storedSnapshot(t, s, "a")); got != c.packed {
			t.Fatalf("%s: packed %v, want %v", c.prefix, got, c.packed)
		}
		if _, err := s.Get(ctx, 0, actors.ShapeKey(v1["p"])); (err == nil) != c.packed {
			t.Fatalf("%s: shape: %v", c.prefix, err)
		}
		cfg.Pipelines = compileAggs(t, map[string]fold.AggregateSpec{"rd_sum": {Op: "sum", Field: "v"}})
		s2, err := redisstore.New(rc, redisstore.Options{Prefix: c.prefix})
		if err != nil {
			t.Fatal(err)
		}
		hs = start(t, s2, cfg)
		if v := hs.query("a"); v.Seq != 2 || v.Aggregates["rd_sum"] != float64(12) {
			t.Errorf("%s: a = %+v", c.prefix, v)
		}
		if r := hs.ingest(event("a", "a2", 1)); r.Duplicates != 1 {
			t.Errorf("%s: a's ids: %+v", c.prefix, r)
		}
		if err := hs.shutdown(); err != nil {
			t.Fatal(err)
		}
	}
}
