package actors_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// TestIDIndexAcrossRestarts, on the embedded store and on Redis, with
// AlwaysIndexIDs: the ids keys apply are stored once, in the store's id index, and the keys'
// snapshots hold only their fingerprints. After a restart, an id resent to
// a key restored from its snapshot is looked up in the index and counted
// as a duplicate; a new id is applied without a look-up. Once the group's
// clock passes an id's bucket by the window, a checkpoint drops it from
// the index, and the id counts as new again (as it would have anyway:
// expired).
func TestIDIndexAcrossRestarts(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		s := openStore(t, t.TempDir()) // (open across the hosts: a host leaves its store open)
		testIDIndexAcrossRestarts(t, func() persistence.Store { return s })
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		testIDIndexAcrossRestarts(t, func() persistence.Store {
			s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "ix"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
}

func testIDIndexAcrossRestarts(t *testing.T, open func() persistence.Store) {
	var clock atomic.Int64
	// The hour begun on the wall clock: the stores judge the ids' expiry
	// (a week past the window) by theirs, and would find ids stamped on a
	// fixed date expired once it is a week behind.
	t0 := time.Now().UTC().Truncate(time.Hour)
	clock.Store(t0.UnixMilli())
	now := func() time.Time { return time.UnixMilli(clock.Load()) }
	ps := compileAggs(t, map[string]fold.AggregateSpec{"n": {Op: "count"}}) // dedup window 1h
	cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour, Pipelines: ps, Now: now, AlwaysIndexIDs: true}

	store := open()
	hs := start(t, store, cfg)
	var evs [][]byte
	for k := range 5 {
		for i := range 10 {
			evs = append(evs, event(fmt.Sprint("k", k), fmt.Sprintf("an-event-id-of-some-length-%d-%d", k, i), 1))
		}
	}
	if r := hs.ingest(evs...); r.Accepted != 50 {
		t.Fatalf("ingest: %+v", r)
	}
	if err := hs.shutdown(); err != nil { // (checkpoints)
		t.Fatal(err)
	}
	// The snapshot holds no id; the index holds each.
	if snap := storedSnapshot(t, store, "k3"); bytes.Contains(snap, []byte("an-event-id")) {
		t.Fatalf("k3's snapshot holds its ids: %q", snap)
	}
	lookup := func(s persistence.Store, key, id string, at time.Time) int64 {
		t.Helper()
		got, err := s.LookupIDs(context.Background(), 0, []persistence.IDLookup{{Bucket: fold.IndexBucket(at.UnixMilli()), Key: "p\x00" + key, ID: id}})
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	if at := lookup(store, "k3", "an-event-id-of-some-length-3-7", t0); at != t0.UnixMilli() {
		t.Fatalf("the index holds k3's id at %d, want %d", at, t0.UnixMilli())
	}

	clock.Add(time.Minute.Milliseconds())
	store = open()
	hs = start(t, store, cfg)
	if r := hs.ingest(event("k3", "an-event-id-of-some-length-3-7", 1), event("k3", "an-event-id-of-some-length-3-2", 1)); r.Duplicates != 2 {
		t.Fatalf("resent ids after a restart: %+v, want 2 duplicates", r)
	}
	if n := hs.host.Stats().IDLookups; n != 2 {
		t.Fatalf("look-ups %d, want 2 (one per resent id)", n)
	}
	if r := hs.ingest(event("k3", "a-new-id", 1)); r.Accepted != 1 {
		t.Fatalf("a new id: %+v", r)
	}
	if n := hs.host.Stats().IDLookups; n != 2 {
		t.Fatalf("look-ups %d after a new id, want still 2", n)
	}
	if v := hs.query("k3"); v.Seq != 11 || v.Duplicates != 2 {
		t.Fatalf("k3 = %+v", v)
	}
	// Two hours later (past the window and the drop's margin) an event
	// moves the group's clock: its checkpoint drops the first buckets.
	clock.Add((2 * time.Hour).Milliseconds())
	hs.ingest(event("k0", "late", 1))
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	if at := lookup(store, "k3", "an-event-id-of-some-length-3-7", t0); at != 0 {
		t.Fatalf("after the window, the index still holds k3's id (at %d)", at)
	}
	if at := lookup(store, "k0", "late", now()); at != clock.Load() {
		t.Fatalf("the index holds the late id at %d, want %d", at, clock.Load())
	}
	store = open()
	hs = start(t, store, cfg)
	defer hs.shutdown()
	if r := hs.ingest(event("k3", "an-event-id-of-some-length-3-7", 1), event("k0", "late", 1)); r.Accepted != 1 || r.Duplicates != 1 {
		t.Fatalf("an expired id and a recent one: %+v, want 1 applied, 1 duplicate", r)
	}
}

// TestIDIndexOnlyWhileKeysLeaveMemory: by default a host's snapshots keep
// ids in full, and the index gets none, while every key fits in memory;
// once a key left memory for want of room (here: no resident tier, so
// every passivated clean key leaves), checkpoints store the ids they hand
// over in the index, their snapshots only fingerprints. Either way a
// resent id is a duplicate after a restart.
func TestIDIndexOnlyWhileKeysLeaveMemory(t *testing.T) {
	store := openStore(t, t.TempDir())
	ps := compileAggs(t, map[string]fold.AggregateSpec{"n": {Op: "count"}})
	cfg := actors.Config{Groups: 1, CheckpointInterval: time.Hour, Pipelines: ps, MaxMemory: -1, IdleTimeout: time.Hour}
	// The index keeps an id under the minute of its time, which the key
	// rounded up to the second: any minute since the test began, or the
	// next one.
	began := time.Now().UnixMilli()
	inIndex := func(key, id string) bool {
		t.Helper()
		for b := fold.IndexBucket(began); b <= fold.IndexBucket(time.Now().UnixMilli()+1000); b++ {
			got, err := store.LookupIDs(context.Background(), 0, []persistence.IDLookup{{Bucket: b, Key: "p\x00" + key, ID: id}})
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != 0 {
				return true
			}
		}
		return false
	}
	hs := start(t, store, cfg)
	hs.ingest(event("a", "an-id-of-a", 1))
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	if snap := storedSnapshot(t, store, "a"); !bytes.Contains(snap, []byte("an-id-of-a")) || inIndex("a", "an-id-of-a") {
		t.Fatalf("every key in memory: a's snapshot %q, index holds its id: %v; want the id in full, not indexed", snap, inIndex("a", "an-id-of-a"))
	}
	if hs.host.Stats().IndexingIDs {
		t.Fatal("every key in memory: Stats.IndexingIDs is set")
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}

	cfg.IdleTimeout, cfg.CheckpointInterval = time.Millisecond, time.Millisecond // (passivation runs at that interval)
	hs = start(t, store, cfg)
	hs.ingest(event("b", "an-id-of-b", 1))
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	hs.awaitGone("b") // stored, passivated: out
	hs.ingest(event("a", "another-id-of-a", 1))
	if err := actors.Checkpoint(hs.host, context.Background()); err != nil {
		t.Fatal(err)
	}
	snap := storedSnapshot(t, store, "a")
	if bytes.Contains(snap, []byte("an-id-of-a")) || bytes.Contains(snap, []byte("another-id-of-a")) {
		t.Fatalf("a key left memory: a's snapshot holds its ids in full: %q", snap)
	}
	if !inIndex("a", "an-id-of-a") || !inIndex("a", "another-id-of-a") {
		t.Fatalf("a key left memory: the index lacks a's ids")
	}
	if !hs.host.Stats().IndexingIDs {
		t.Fatal("a key left memory: Stats.IndexingIDs is not set")
	}
	if err := hs.shutdown(); err != nil {
		t.Fatal(err)
	}
	hs = start(t, store, cfg)
	defer hs.shutdown()
	if r := hs.ingest(event("a", "an-id-of-a", 1), event("a", "another-id-of-a", 1), event("b", "an-id-of-b", 1)); r.Duplicates != 3 {
		t.Fatalf("resent ids after restarts: %+v, want 3 duplicates", r)
	}
}
