package redisstore_test

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/persistencetest"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// TestConformance runs the store suite against a real redis-server. Each
// test gets its own prefix on one server; Reopen kills the server with
// SIGKILL and starts it again from its append-only file, so the durability
// tests check what survives a crash of Redis itself.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	var n atomic.Int64
	open := func(t *testing.T, prefix string) persistence.Store {
		s, err := redisstore.Open(srv.URL(), redisstore.Options{Prefix: prefix, ReadPageSize: 7})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	prefixes := map[persistence.Store]string{}
	persistencetest.Run(t, persistencetest.Harness{
		New: func(t *testing.T) persistence.Store {
			p := fmt.Sprintf("conformance-%d", n.Add(1))
			s := open(t, p)
			prefixes[s] = p
			return s
		},
		Reopen: func(t *testing.T, s persistence.Store) persistence.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			srv.Kill()
			srv.Restart()
			r := open(t, prefixes[s])
			prefixes[r] = prefixes[s]
			return r
		},
		// Checkpoint appends outputs before its fenced script.
		OutputsAtLeastOnce: true,
	})
}

// TestLayout checks the documented key layout: every key of a group carries
// the group's hash tag (one Redis Cluster slot), and a checkpoint leaves
// only the records above it in the stream.
func TestLayout(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	s, err := redisstore.New(rc, redisstore.Options{Prefix: "lay"})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.CheckGroups(ctx, 16, 2); err != nil || l != 2 {
		t.Fatalf("CheckGroups of a new store: layout %d, %v; want 2", l, err)
	}
	// A store created before the key-group layout was recorded has none:
	// it reads as 0, and is not given one.
	if got := rc.HGet(ctx, "lay:meta", "keylayout").Val(); got != "2" {
		t.Errorf("lay:meta keylayout = %q, want 2", got)
	}
	rc.HDel(ctx, "lay:meta", "keylayout")
	for range 2 {
		if l, err := s.CheckGroups(ctx, 16, 2); err != nil || l != 0 {
			t.Fatalf("CheckGroups of an old store: layout %d, %v; want 0", l, err)
		}
	}
	st, err := s.Claim(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	entries := []persistence.Entry{{Group: 7, Epoch: st.Epoch, Data: []byte("a")}, {Group: 7, Epoch: st.Epoch, Data: []byte("b")}}
	if _, err := s.Append(ctx, entries); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, 7, st.Epoch, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{{Key: "k\x00x", Data: []byte("snap")}},
		Timers:    []persistence.Timer{{Key: "k\x00x", Due: 1767225600000}, {Key: "t", Due: 5}},
		Outputs:   []persistence.Output{{Pipeline: "pipe", Data: []byte("o1")}, {Pipeline: "pipe", Data: []byte("o2")}},
		Through:   1,
	}); err != nil {
		t.Fatal(err)
	}
	keys, err := rc.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := []string{"lay:meta", "lay:out:pipe", "{lay:7}:due", "{lay:7}:log", "{lay:7}:m", "{lay:7}:s:k\x00x"}
	if !slices.Equal(keys, want) {
		t.Errorf("keys = %q, want %q", keys, want)
	}
	if got := rc.HGetAll(ctx, "{lay:7}:m").Val(); got["epoch"] != "1" || got["checkpoint"] != "1" || got["last"] != "2" {
		t.Errorf("group meta = %v", got)
	}
	if got := rc.XRange(ctx, "{lay:7}:log", "-", "+").Val(); len(got) != 1 || got[0].ID != "2-0" || got[0].Values["d"] != "b" {
		t.Errorf("log = %v, want the one record 2-0 above the checkpoint", got)
	}
	if got := rc.HGetAll(ctx, "lay:meta").Val(); got["groups"] != "16" || got["format"] != "2" {
		t.Errorf("store meta = %v", got)
	}
	wantDue := []redis.Z{{Score: 5, Member: "t"}, {Score: 1767225600000, Member: "k\x00x"}}
	if got := rc.ZRangeWithScores(ctx, "{lay:7}:due", 0, -1).Val(); !slices.Equal(got, wantDue) {
		t.Errorf("timer index = %v, want %v", got, wantDue)
	}
	out := rc.XRange(ctx, "lay:out:pipe", "-", "+").Val()
	if len(out) != 2 || out[0].Values["d"] != "o1" || out[1].Values["d"] != "o2" {
		t.Errorf("output log = %v, want o1 and o2 in field d", out)
	}
	if got, err := s.ReadOutputs(ctx, "pipe", "", 10); err != nil || len(got) != 2 || got[0].Cursor != out[0].ID {
		t.Errorf("ReadOutputs = %v, %v; want the stream IDs as cursors", got, err)
	}
}

// TestFormatVersions: a new store records format 2, which allows packed
// snapshots; a store created at format 1 keeps it and does not allow them
// (nodes of an older build may run on it); another format is refused.
func TestFormatVersions(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	for _, c := range []struct {
		prefix, format string // "": a new store
		packed         bool
		refused        bool
	}{
		{prefix: "new", packed: true},
		{prefix: "old", format: "1"},
		{prefix: "newer", format: "3", refused: true},
	} {
		if c.format != "" {
			rc.HSet(ctx, c.prefix+":meta", "format", c.format, "groups", "16", "keylayout", "2")
		}
		s, err := redisstore.New(rc, redisstore.Options{Prefix: c.prefix})
		if err != nil {
			t.Fatal(err)
		}
		if s.PackedSnapshots() {
			t.Errorf("%s: packed snapshots allowed before the format is known", c.prefix)
		}
		_, err = s.CheckGroups(ctx, 16, 2)
		if c.refused {
			if !errors.Is(err, persistence.ErrIncompatible) {
				t.Errorf("%s: CheckGroups = %v, want ErrIncompatible", c.prefix, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.prefix, err)
		}
		if s.PackedSnapshots() != c.packed || persistence.AllowsPacked(s) != c.packed {
			t.Errorf("%s: packed snapshots allowed: %v, want %v", c.prefix, s.PackedSnapshots(), c.packed)
		}
		if got := rc.HGet(ctx, c.prefix+":meta", "format").Val(); got != cmp.Or(c.format, "2") {
			t.Errorf("%s: format %q recorded", c.prefix, got)
		}
	}
}

// TestCheckpointOutputsAtLeastOnce: a checkpoint appends its outputs before
// its fenced script runs, so a fenced checkpoint still appends them (and
// writes nothing else), as Store.Checkpoint documents.
func TestCheckpointOutputsAtLeastOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "alo"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, 1); err != nil {
		t.Fatal(err)
	}
	err = s.Checkpoint(ctx, 1, old.Epoch, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("stale")}},
		Timers:    []persistence.Timer{{Key: "k", Due: 9}},
		Outputs:   []persistence.Output{{Pipeline: "pipe", Data: []byte("stale")}},
	})
	if !errors.Is(err, persistence.ErrFenced) {
		t.Fatalf("Checkpoint with a stale epoch = %v, want ErrFenced", err)
	}
	if got, err := s.ReadOutputs(ctx, "pipe", "", 10); err != nil || len(got) != 1 || string(got[0].Data) != "stale" {
		t.Errorf("outputs after a fenced checkpoint = %v, %v; want its output", got, err)
	}
	if _, err := s.Get(ctx, 1, "k"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("Get after a fenced checkpoint = %v, want ErrNotFound", err)
	}
	n := 0
	if err := s.Timers(ctx, 1, func(string, int64) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("Timers after a fenced checkpoint: %d entries, %v; want none", n, err)
	}
}

// TestScriptCacheFlushed: after Redis lost its script cache (a restart, a
// SCRIPT FLUSH) every operation still works, the pipelined Append included.
func TestScriptCacheFlushed(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	s, err := redisstore.New(rc, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		if err := rc.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		st, err := s.Claim(ctx, 1)
		if err != nil {
			t.Fatalf("round %d: Claim: %v", round, err)
		}
		st2, err := s.Claim(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		pos, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("x")}, {Group: 2, Epoch: st2.Epoch, Data: []byte("y")}})
		if err != nil || pos[0] != persistence.Position(round+1) || pos[1] != persistence.Position(round+1) {
			t.Fatalf("round %d: Append = %v, %v", round, pos, err)
		}
		if err := rc.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{
			Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("v")}},
			Timers:    []persistence.Timer{{Key: "k", Due: int64(round + 1)}},
			Outputs:   []persistence.Output{{Pipeline: "pipe", Data: []byte("o")}},
			Through:   pos[0],
		}); err != nil {
			t.Fatalf("round %d: Checkpoint: %v", round, err)
		}
	}
}

// TestAppendIsConditional: an append expects the group's log to end where
// this store last saw it. If an earlier append whose outcome the store did
// not learn landed (simulated here by writing one behind its back), or
// go-redis sends a script call twice, the append fails instead of adding a
// record twice; claiming the group again makes appends work.
func TestAppendIsConditional(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	s, err := redisstore.New(rc, redisstore.Options{Prefix: "c"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	app := func() ([]persistence.Position, error) {
		return s.Append(ctx, []persistence.Entry{{Group: 3, Epoch: st.Epoch, Data: []byte("r")}})
	}
	if pos, err := app(); err != nil || pos[0] != 1 {
		t.Fatalf("Append = %v, %v", pos, err)
	}
	// A record that landed without the store knowing.
	rc.XAdd(ctx, &redis.XAddArgs{Stream: "{c:3}:log", ID: "2-0", Values: []string{"d", "ghost"}})
	rc.HSet(ctx, "{c:3}:m", "last", "2")
	pos, err := app()
	if err == nil || errors.Is(err, persistence.ErrFenced) || pos[0] != 0 {
		t.Fatalf("Append after an unseen record = %v, %v; want a non-fencing error and no position", pos, err)
	}
	if n := rc.XLen(ctx, "{c:3}:log").Val(); n != 2 {
		t.Errorf("log has %d records, want 2", n)
	}
	if st, err = s.Claim(ctx, 3); err != nil || st.Last != 2 {
		t.Fatalf("Claim = %+v, %v", st, err)
	}
	if pos, err := app(); err != nil || pos[0] != 3 {
		t.Fatalf("Append after the claim = %v, %v; want position 3", pos, err)
	}
}

// TestOpenURL: Open takes the user, password and database from the URL; a
// wrong password fails the first call with Redis's error, which does not
// quote the password; a URL Open cannot parse is refused before any I/O.
func TestOpenURL(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	ctx := t.Context()
	s, err := redisstore.Open("redis://default:s3cret@"+srv.Addr()+"/3", redisstore.Options{Prefix: "u"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CheckGroups(ctx, 8, 2); err != nil {
		t.Fatalf("CheckGroups with the right password: %v", err)
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "s3cret", DB: 3})
	defer rc.Close()
	if got := rc.HGet(ctx, "u:meta", "groups").Val(); got != "8" {
		t.Errorf("database 3 holds groups=%q, want 8", got)
	}

	bad, err := redisstore.Open("redis://default:wrong-pw@"+srv.Addr()+"/0", redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.CheckGroups(ctx, 8, 2)
	if err == nil || strings.Contains(err.Error(), "wrong-pw") {
		t.Errorf("CheckGroups with a wrong password = %v; want an error that does not quote it", err)
	}
	if _, err := redisstore.Open("http://"+srv.Addr(), redisstore.Options{}); err == nil {
		t.Error("Open of an http:// URL succeeded")
	}
	if _, err := redisstore.Open(srv.URL(), redisstore.Options{Prefix: "a{b"}); err == nil {
		t.Error("Open with a prefix containing a brace succeeded")
	}
}

// TestOutputCursors: a cursor is a stream ID, ms-seq; "0-0" comes before
// every entry; the largest ID, an ID past the stream's last, and a cursor of
// another store's form (the embedded store's plain numbers) are refused.
func TestOutputCursors(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "cur"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Outputs: []persistence.Output{{Pipeline: "p", Data: []byte("o")}}}); err != nil {
		t.Fatal(err)
	}
	all, err := s.ReadOutputs(ctx, "p", "", 10)
	if err != nil || len(all) != 1 {
		t.Fatalf("ReadOutputs = %v, %v", all, err)
	}
	for cursor, want := range map[string]int{"0-0": 1, all[0].Cursor: 0} {
		if got, err := s.ReadOutputs(ctx, "p", cursor, 10); err != nil || len(got) != want {
			t.Errorf("ReadOutputs after %q = %v, %v; want %d entries", cursor, got, err, want)
		}
	}
	// Past the last ID the stream generated: no entry has it, and a reader
	// holding it would skip what comes next.
	for _, cursor := range []string{"5", "18446744073709551616-0", "1-18446744073709551616",
		"18446744073709551615-18446744073709551615", "99999999999999-0"} {
		if _, err := s.ReadOutputs(ctx, "p", cursor, 10); !errors.Is(err, persistence.ErrBadCursor) {
			t.Errorf("ReadOutputs after %q = %v, want ErrBadCursor", cursor, err)
		}
	}
}
