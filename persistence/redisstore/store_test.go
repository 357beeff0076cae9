package redisstore_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	t.Run("format 4", func(t *testing.T) { testConformance(t, "") })
	// A store created at format 3 keeps it: its records are stored as
	// they are.
	t.Run("format 3", func(t *testing.T) { testConformance(t, "3") })
	// A store created at format 2 keeps its layout (one log per group,
	// whatever the epoch; the last position in the group's meta).
	t.Run("format 2", func(t *testing.T) { testConformance(t, "2") })
}

// testConformance runs the suite on stores that are new, or recorded the
// given format before their first call.
func testConformance(t *testing.T, format string) {
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
			if format != "" {
				if err := srv.Client().HSet(t.Context(), p+":meta", "format", format).Err(); err != nil {
					t.Fatal(err)
				}
			}
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
		NoIDIndex:          format == "2",
	})
}

// newAtFormat returns a store with prefix p that recorded format before
// its first call ("": a new store).
func newAtFormat(t *testing.T, rc *redis.Client, p, format string) *redisstore.Store {
	t.Helper()
	if format != "" {
		rc.HSet(t.Context(), p+":meta", "format", format)
	}
	s, err := redisstore.New(rc, redisstore.Options{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLayout checks the documented key layout of each format: every key of
// a group carries the group's hash tag (one Redis Cluster slot), and a
// checkpoint leaves only the records above it in the stream.
func TestLayout(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	for _, c := range []struct {
		format  string // recorded before the store's first call ("": new)
		log     string // group 7's log after its first claim
		meta    map[string]string
		recheck bool // a second claim renames the log
	}{
		{format: "", log: "{lay4:7}:log:1", meta: map[string]string{"epoch": "1", "checkpoint": "1"}},
		{format: "3", log: "{lay3:7}:log:1", meta: map[string]string{"epoch": "1", "checkpoint": "1"}},
		{format: "2", log: "{lay2:7}:log", meta: map[string]string{"epoch": "1", "checkpoint": "1", "last": "2"}},
	} {
		p := "lay" + cmp.Or(c.format, "4")
		s := newAtFormat(t, rc, p, c.format)
		if l, err := s.CheckGroups(ctx, 16, 2); err != nil || l != 2 {
			t.Fatalf("%s: CheckGroups of a new store: layout %d, %v; want 2", p, l, err)
		}
		// A store created before the key-group layout was recorded has none:
		// it reads as 0, and is not given one.
		if got := rc.HGet(ctx, p+":meta", "keylayout").Val(); got != "2" {
			t.Errorf("%s:meta keylayout = %q, want 2", p, got)
		}
		rc.HDel(ctx, p+":meta", "keylayout")
		for range 2 {
			if l, err := s.CheckGroups(ctx, 16, 2); err != nil || l != 0 {
				t.Fatalf("%s: CheckGroups of an old store: layout %d, %v; want 0", p, l, err)
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
		keys, err := rc.Keys(ctx, p+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		tagged, err := rc.Keys(ctx, "{"+p+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tagged...)
		slices.Sort(keys)
		tag := "{" + p + ":7}"
		want := []string{p + ":meta", p + ":out:pipe", tag + ":due", c.log, tag + ":m", tag + ":s:k\x00x"}
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Errorf("%s: keys = %q, want %q", p, keys, want)
		}
		if got := rc.HGetAll(ctx, tag+":m").Val(); !maps.Equal(got, c.meta) {
			t.Errorf("%s: group meta = %v, want %v", p, got, c.meta)
		}
		if got := rc.XRange(ctx, c.log, "-", "+").Val(); len(got) != 1 || got[0].ID != "2-0" || got[0].Values["d"] != "b" {
			t.Errorf("%s: log = %v, want the one record 2-0 above the checkpoint", p, got)
		}
		if got := rc.HGetAll(ctx, p+":meta").Val(); got["groups"] != "16" || got["format"] != cmp.Or(c.format, "4") {
			t.Errorf("%s: store meta = %v", p, got)
		}
		wantDue := []redis.Z{{Score: 5, Member: "t"}, {Score: 1767225600000, Member: "k\x00x"}}
		if got := rc.ZRangeWithScores(ctx, tag+":due", 0, -1).Val(); !slices.Equal(got, wantDue) {
			t.Errorf("%s: timer index = %v, want %v", p, got, wantDue)
		}
		out := rc.XRange(ctx, p+":out:pipe", "-", "+").Val()
		if len(out) != 2 || out[0].Values["d"] != "o1" || out[1].Values["d"] != "o2" {
			t.Errorf("%s: output log = %v, want o1 and o2 in field d", p, out)
		}
		if got, err := s.ReadOutputs(ctx, "pipe", "", 10); err != nil || len(got) != 2 || got[0].Cursor != out[0].ID {
			t.Errorf("%s: ReadOutputs = %v, %v; want the stream IDs as cursors", p, got, err)
		}
		if c.format == "2" {
			continue
		}
		// Formats 3 and 4: the next claim moves the log to the next epoch's
		// name, trimmed records and last position with it.
		if st, err = s.Claim(ctx, 7); err != nil || st.Epoch != 2 || st.Last != 2 || st.Checkpoint != 1 {
			t.Fatalf("%s: second Claim = %+v, %v; want epoch 2, checkpoint 1, last 2", p, st, err)
		}
		if n := rc.Exists(ctx, c.log).Val(); n != 0 {
			t.Errorf("%s: %s still there after the second claim", p, c.log)
		}
		if got := rc.XRange(ctx, tag+":log:2", "-", "+").Val(); len(got) != 1 || got[0].ID != "2-0" {
			t.Errorf("%s: log under epoch 2 = %v, want record 2-0", p, got)
		}
		// A group whose log went missing is not claimed over it.
		rc.Del(ctx, tag+":log:2")
		if _, err := s.Claim(ctx, 7); err == nil || !strings.Contains(err.Error(), "missing") {
			t.Errorf("%s: Claim of a group without its log = %v, want an error saying it is missing", p, err)
		}
	}
}

// TestFormatVersions: a new store records format 4, which allows packed
// snapshots, as do 3 and 2; a store created at format 3, 2 or 1 keeps it,
// and one of format 1 does not allow them (nodes of an older build may run
// on it); another format is refused.
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
		{prefix: "three", format: "3", packed: true},
		{prefix: "two", format: "2", packed: true},
		{prefix: "old", format: "1"},
		{prefix: "newer", format: "5", refused: true},
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
		if c.refused {
			// A group operation before CheckGroups reads the format too.
			if _, err := s.Claim(ctx, 1); !errors.Is(err, persistence.ErrIncompatible) {
				t.Errorf("%s: Claim = %v, want ErrIncompatible", c.prefix, err)
			}
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
		if got := rc.HGet(ctx, c.prefix+":meta", "format").Val(); got != cmp.Or(c.format, "4") {
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

// claimedIn returns a store of the given prefix whose format was recorded
// before its first call, and its claim of a group.
func claimedIn(t *testing.T, rc *redis.Client, prefix, format string, group uint32) (*redisstore.Store, persistence.GroupState) {
	t.Helper()
	if err := rc.HSet(t.Context(), prefix+":meta", "format", format).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(rc, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(t.Context(), group)
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

// TestAppendIsConditional: an append expects the group's log to end where
// this store last saw it. If an earlier append whose outcome the store did
// not learn landed (simulated here by writing one behind its back), or
// go-redis sends a script call twice, the append fails instead of adding a
// record twice; claiming the group again makes appends work. In each
// format.
func TestAppendIsConditional(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	for _, format := range []string{"3", "2"} {
		p := "c" + format
		s, st := claimedIn(t, rc, p, format, 3)
		app := func() ([]persistence.Position, error) {
			return s.Append(ctx, []persistence.Entry{{Group: 3, Epoch: st.Epoch, Data: []byte("r")}})
		}
		if pos, err := app(); err != nil || pos[0] != 1 {
			t.Fatalf("format %s: Append = %v, %v", format, pos, err)
		}
		// A record that landed without the store knowing.
		log := "{" + p + ":3}:log"
		if format == "3" {
			log += ":1"
		} else {
			rc.HSet(ctx, "{"+p+":3}:m", "last", "2")
		}
		rc.XAdd(ctx, &redis.XAddArgs{Stream: log, ID: "2-0", Values: []string{"d", "ghost"}})
		pos, err := app()
		if err == nil || errors.Is(err, persistence.ErrFenced) || !strings.Contains(err.Error(), "not at position 1") || pos[0] != 0 {
			t.Fatalf("format %s: Append after an unseen record = %v, %v; want an error saying the log is not at position 1, and no position", format, pos, err)
		}
		if format == "3" {
			log = "{" + p + ":3}:log:2" // where the claim below moves it
		}
		if st, err = s.Claim(ctx, 3); err != nil || st.Last != 2 {
			t.Fatalf("format %s: Claim = %+v, %v", format, st, err)
		}
		if n := rc.XLen(ctx, log).Val(); n != 2 {
			t.Errorf("format %s: log has %d records, want 2", format, n)
		}
		if pos, err := app(); err != nil || pos[0] != 3 {
			t.Fatalf("format %s: Append after the claim = %v, %v; want position 3", format, pos, err)
		}
	}
}

// TestReadAcrossAClaim: a claim renames a format 3 group's log; a Read
// that meets the rename between two pages goes on from where it was under
// the new name, and reads every record once, as it would in format 2,
// where a claim moves nothing.
func TestReadAcrossAClaim(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "rc", ReadPageSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	other, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "rc"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	const records = 10
	for i := range records {
		if _, err := s.Append(ctx, []persistence.Entry{{Group: 2, Epoch: st.Epoch, Data: fmt.Appendf(nil, "r%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err = s.Read(ctx, 2, 0, func(p persistence.Position, d []byte) error {
		got = append(got, fmt.Sprintf("%d:%s", p, d))
		if len(got)%3 == 1 { // within each page: a claim before the next one
			if _, err := other.Claim(ctx, 2); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Read across claims: %v", err)
	}
	var want []string
	for i := range records {
		want = append(want, fmt.Sprintf("%d:r%d", i+1, i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("Read across claims = %q, want %q", got, want)
	}
	// The first owner is fenced: its append adds nothing.
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 2, Epoch: st.Epoch, Data: []byte("late")}}); !errors.Is(err, persistence.ErrFenced) {
		t.Errorf("Append of the first owner after the claims = %v, want ErrFenced", err)
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

// TestLostTail: when Redis loses a group's last acknowledged records under
// its owner (simulated by restoring the log, and format 2's meta, from a
// dump taken before them), format 2 fails the owner's next append (the log
// does not end where it expects), and format 3 adds the record after the
// gap, as keys.go documents; Read returns what is there.
func TestLostTail(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	for _, format := range []string{"3", "2"} {
		p := "lost" + format
		s, st := claimedIn(t, rc, p, format, 1)
		app := func(d string) ([]persistence.Position, error) {
			return s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte(d)}})
		}
		if _, err := app("r1"); err != nil {
			t.Fatal(err)
		}
		keys := []string{"{" + p + ":1}:log:1", "{" + p + ":1}:m"}
		if format == "2" {
			keys[0] = "{" + p + ":1}:log"
		}
		dumps := make([]string, len(keys))
		for i, k := range keys {
			dumps[i] = rc.Dump(ctx, k).Val()
		}
		if _, err := app("r2"); err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			if err := rc.RestoreReplace(ctx, k, 0, dumps[i]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		pos, err := app("r3")
		var got []persistence.Position
		if err := s.Read(ctx, 1, 0, func(p persistence.Position, _ []byte) error { got = append(got, p); return nil }); err != nil {
			t.Fatal(err)
		}
		switch format {
		case "2":
			if err == nil || !strings.Contains(err.Error(), "not at position 2") {
				t.Errorf("format 2: Append after a lost record = %v, %v; want an error saying the log is not at position 2", pos, err)
			}
			if !slices.Equal(got, []persistence.Position{1}) {
				t.Errorf("format 2: log positions %v, want [1]", got)
			}
		case "3":
			if err != nil || pos[0] != 3 {
				t.Errorf("format 3: Append after a lost record = %v, %v; want position 3, after the gap", pos, err)
			}
			if !slices.Equal(got, []persistence.Position{1, 3}) {
				t.Errorf("format 3: log positions %v, want [1 3]", got)
			}
		}
	}
}

// claimAfterXInfo is a go-redis hook that, once, has another store claim a
// group right after the checkpoint's XINFO STREAM, between its checks and
// its MULTI/EXEC.
type claimAfterXInfo struct {
	claim func()
	done  atomic.Bool
}

func (h *claimAfterXInfo) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *claimAfterXInfo) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *claimAfterXInfo) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "xinfo" && !h.done.Swap(true) {
			h.claim()
		}
		return err
	}
}

// TestCheckpointRacingAClaim: a format 3 checkpoint checks the epoch and
// the position, then writes in a MULTI/EXEC under a WATCH of the group's
// meta; a claim that lands between the two makes Redis drop the write, and
// the checkpoint is fenced and writes nothing.
func TestCheckpointRacingAClaim(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	other, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "race"})
	if err != nil {
		t.Fatal(err)
	}
	rc := srv.Client()
	hook := &claimAfterXInfo{claim: func() {
		if _, err := other.Claim(ctx, 4); err != nil {
			t.Errorf("the racing claim: %v", err)
		}
	}}
	rc.AddHook(hook)
	s, st := claimedIn(t, rc, "race", "3", 4)
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 4, Epoch: st.Epoch, Data: []byte("r")}}); err != nil {
		t.Fatal(err)
	}
	err = s.Checkpoint(ctx, 4, st.Epoch, persistence.CheckpointData{
		Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("stale")}},
		Timers:    []persistence.Timer{{Key: "k", Due: 9}},
		Through:   1,
	})
	if !hook.done.Load() {
		t.Fatal("the checkpoint sent no XINFO STREAM")
	}
	if !errors.Is(err, persistence.ErrFenced) {
		t.Fatalf("Checkpoint racing a claim = %v, want ErrFenced", err)
	}
	if _, err := other.Get(ctx, 4, "k"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("Get after the fenced checkpoint = %v, want ErrNotFound", err)
	}
	st2, err := other.Claim(ctx, 4)
	if err != nil || st2.Checkpoint != 0 || st2.Last != 1 {
		t.Errorf("Claim after the fenced checkpoint = %+v, %v; want checkpoint 0, last 1", st2, err)
	}
}

// TestIDBucketExpiry: a bucket of a group's id index expires at the latest
// expiry of the ids stored in it, whichever checkpoint stored them (a
// later, earlier expiry does not shorten it), and an id without one keeps
// the bucket; a drop deletes the buckets below it, and their names leave
// the group's list of buckets.
func TestIDBucketExpiry(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	s, err := redisstore.New(srv.Client(), redisstore.Options{Prefix: "ids"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	checkpoint := func(ids ...persistence.StoredID) {
		t.Helper()
		if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{IDs: ids}); err != nil {
			t.Fatal(err)
		}
	}
	id := func(bucket int64, name string, expires time.Duration) persistence.StoredID {
		e := int64(0)
		if expires != 0 {
			e = now.Add(expires).UnixMilli()
		}
		return persistence.StoredID{Bucket: bucket, Key: "k", ID: name, At: 1, Expires: e}
	}
	ttl := func(bucket int) time.Duration {
		t.Helper()
		d, err := srv.Client().PTTL(ctx, "{ids:1}:ids:"+strconv.Itoa(bucket)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	near := func(got, want time.Duration) bool { return got > want-time.Minute && got <= want }

	checkpoint(id(0, "a", time.Hour), id(0, "b", 2*time.Hour), id(1, "c", time.Hour))
	if got := ttl(0); !near(got, 2*time.Hour) {
		t.Errorf("bucket 0 expires in %v, want about 2h (its latest id's)", got)
	}
	checkpoint(id(0, "d", 30*time.Minute), id(1, "e", 3*time.Hour))
	if got := ttl(0); !near(got, 2*time.Hour) {
		t.Errorf("bucket 0 after an id expiring sooner: expires in %v, want about 2h still", got)
	}
	if got := ttl(1); !near(got, 3*time.Hour) {
		t.Errorf("bucket 1 after an id expiring later: expires in %v, want about 3h", got)
	}
	checkpoint(id(2, "f", time.Hour), id(2, "g", 0))
	if got := ttl(2); got != -1 {
		t.Errorf("bucket 2 with an id that never expires: PTTL %v, want -1 (no expiry)", got)
	}

	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{DropIDsBefore: 2}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []int{0, 1} {
		if n, err := srv.Client().Exists(ctx, "{ids:1}:ids:"+strconv.Itoa(b)).Result(); err != nil || n != 0 {
			t.Errorf("bucket %d after a drop below 2: exists %d, %v; want gone", b, n, err)
		}
	}
	if got, err := srv.Client().ZRange(ctx, "{ids:1}:idb", 0, -1).Result(); err != nil || !slices.Equal(got, []string{"2"}) {
		t.Errorf("the group's buckets after the drop = %v, %v; want [2]", got, err)
	}
	at, err := s.LookupIDs(ctx, 1, []persistence.IDLookup{{Bucket: 0, Key: "k", ID: "a"}, {Bucket: 2, Key: "k", ID: "g"}})
	if err != nil || !slices.Equal(at, []int64{0, 1}) {
		t.Errorf("LookupIDs after the drop = %v, %v; want [0 1]", at, err)
	}
}

// TestCompressedRecords: a format 4 store keeps a record that S2 makes
// smaller in field s and one it does not in field d; a format 3 store keeps
// every record in field d (a node of an older build may read its logs).
// Read returns each record as appended, and fails on a damaged entry.
func TestCompressedRecords(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client()
	ctx := t.Context()
	records := [][]byte{
		[]byte(strings.Repeat(`{"user_id":"u7","type":"login_ok","geo":{"country":"DE"}}`, 6)),
		[]byte("x"),
		{0x9e, 0x11, 0x42, 0x07, 0xd3, 0x5a, 0xc1, 0x88},
		[]byte(strings.Repeat(`{"user_id":"u8","type":"login_failed"}`, 3)),
	}
	for _, c := range []struct {
		format string
		fields string // of the records in the log
	}{{"", "sdds"}, {"3", "dddd"}} {
		p := "rec" + cmp.Or(c.format, "4")
		s := newAtFormat(t, rc, p, c.format)
		if _, err := s.CheckGroups(ctx, 16, 2); err != nil {
			t.Fatal(err)
		}
		st, err := s.Claim(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range records { // one record a call: the host's appends
			if _, err := s.Append(ctx, []persistence.Entry{{Group: 3, Epoch: st.Epoch, Data: r}}); err != nil {
				t.Fatal(err)
			}
		}
		log := "{" + p + ":3}:log:" + strconv.FormatUint(st.Epoch, 10)
		var fields string
		for i, m := range rc.XRange(ctx, log, "-", "+").Val() {
			for f, v := range m.Values {
				fields += f
				if f == "s" && len(v.(string)) >= len(records[i]) {
					t.Errorf("%s: record %d compressed to %d bytes from %d", p, i, len(v.(string)), len(records[i]))
				}
			}
		}
		if fields != c.fields {
			t.Errorf("%s: the records' fields are %q, want %q", p, fields, c.fields)
		}
		// read returns the group's records.
		read := func() ([][]byte, error) {
			var got [][]byte
			err := s.Read(ctx, 3, 0, func(_ persistence.Position, d []byte) error {
				got = append(got, d)
				return nil
			})
			return got, err
		}
		got, err := read()
		if err != nil || !slices.EqualFunc(got, records, bytes.Equal) {
			t.Errorf("%s: Read = %q, %v; want %q", p, got, err, records)
		}
		// After Redis is killed and restarted from its append-only file,
		// and a claim renamed the log: the same records.
		srv.Kill()
		srv.Restart()
		if st, err = s.Claim(ctx, 3); err != nil || st.Last != 4 {
			t.Fatalf("%s: claim after Redis's restart = %+v, %v; want last position 4", p, st, err)
		}
		log = "{" + p + ":3}:log:" + strconv.FormatUint(st.Epoch, 10)
		got, err = read()
		if err != nil || !slices.EqualFunc(got, records, bytes.Equal) {
			t.Errorf("%s: Read after a restart and a claim = %q, %v; want %q", p, got, err, records)
		}
		// A damaged entry (a block that says it holds 1 GiB) fails the
		// read, naming it, after the records before it.
		rc.XAdd(ctx, &redis.XAddArgs{Stream: log, ID: "5-0", Values: []any{"s", "\x80\x80\x80\x80\x04\x00a"}})
		got, err = read()
		if err == nil || !strings.Contains(err.Error(), "5-0") || len(got) != len(records) {
			t.Errorf("%s: Read of a damaged entry = %d records, %v; want the %d before it and an error naming 5-0", p, len(got), err, len(records))
		}
	}
}
