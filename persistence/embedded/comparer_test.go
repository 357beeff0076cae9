package embedded

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/keyfold/keyfold/persistence"
)

// comparerKeys returns keys of the shapes the store writes: snapshots of
// keys (pipeline NUL key), their parts (… NUL part), other names, and
// keys of other kinds, in groups whose bytes hold NULs or not.
func comparerKeys() [][]byte {
	var keys [][]byte
	names := []string{"", "a", "ab", "b", "\x01", "a\x00", "a\x00b", "a\x00ab", "a\x00a\x00", "a\x00a\x00b", "a\x00a\x00b\x00c", "a\x00b\x00a", "\x00shape/p/1", "a\x00\x01", "a\x00\x00"}
	for _, kind := range []byte{kindSnapshot, kindTimer, kindEpoch} {
		for _, group := range []uint32{0, 1, 0x100, 0xffffffff} {
			for _, name := range names {
				keys = append(keys, append(groupKey(kind, group, len(name)), name...))
			}
		}
	}
	return append(keys, []byte{kindSnapshot}, []byte{kindSnapshot, 0, 0})
}

// TestKeyComparer: keyComparer's Split and ImmediateSuccessor keep
// Pebble's rules (internal/base/comparer.go) on every pair of the keys the
// store writes; FuzzKeyComparer on any.
func TestKeyComparer(t *testing.T) {
	keys := comparerKeys()
	for _, a := range keys {
		for _, b := range keys {
			if err := checkSplit(a, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The snapshot of a key is a prefix of its own, and its parts' prefix.
	core := snapshotKey(7, "pipe\x00key")
	if n := splitKey(core); n != len(core) {
		t.Fatalf("a key's snapshot splits at %d of %d", n, len(core))
	}
	part := snapshotKey(7, "pipe\x00key\x00b12p3")
	if n := splitKey(part); n != len(core) {
		t.Fatalf("a part splits at %d, want its key's %d", n, len(core))
	}
	// ImmediateSuccessor: the smallest prefix after each prefix.
	for _, p := range keys {
		if splitKey(p) != len(p) {
			continue
		}
		succ := immediateSuccessor([]byte("junk"), p)
		if !bytes.HasPrefix(succ, []byte("junk")) {
			t.Fatalf("ImmediateSuccessor(%q) did not append to dst", p)
		}
		succ = succ[len("junk"):]
		if splitKey(succ) != len(succ) || bytes.Compare(succ, p) <= 0 {
			t.Fatalf("ImmediateSuccessor(%q) = %q: not a prefix after it", p, succ)
		}
		for _, k := range keys {
			if splitKey(k) == len(k) && bytes.Compare(k, p) > 0 && bytes.Compare(k, succ) < 0 {
				t.Fatalf("ImmediateSuccessor(%q) = %q, but prefix %q is between", p, succ, k)
			}
		}
	}
}

// checkSplit checks Pebble's rules for Split on keys a and b.
func checkSplit(a, b []byte) error {
	pa, pb := a[:splitKey(a)], b[:splitKey(b)]
	sa, sb := a[len(pa):], b[len(pb):]
	switch {
	case splitKey(pa) != len(pa):
		return fmt.Errorf("prefix %q of %q is not a prefix of its own", pa, a)
	case len(sa) > 0 && bytes.Compare(pa, a) >= 0:
		return fmt.Errorf("%q does not sort after its prefix %q", a, pa)
	case bytes.Compare(a, b) <= 0 && bytes.Compare(pa, pb) > 0:
		return fmt.Errorf("%q <= %q, but their prefixes %q > %q", a, b, pa, pb)
	case bytes.Compare(pa, pb) < 0 && bytes.Compare(a, b) >= 0:
		return fmt.Errorf("prefixes %q < %q, but %q >= %q", pa, pb, a, b)
	case bytes.Equal(pa, pb) && bytes.Compare(a, b) != bytes.Compare(sa, sb):
		return fmt.Errorf("%q and %q of one prefix do not sort as their suffixes %q, %q", a, b, sa, sb)
	}
	return nil
}

func FuzzKeyComparer(f *testing.F) {
	keys := comparerKeys()
	for i := range keys {
		f.Add(keys[i], keys[(i*7+3)%len(keys)])
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if err := checkSplit(a, b); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGetGroupsWithParts: a store ordered by keyComparer reads each key's
// snapshot and the snapshots named after it (its parts) in one read, in
// the memtable, in tables and after a reopen; none of another key whose
// name starts with its name, none of a key without a snapshot. A store
// created with Pebble's default comparer (before keyComparer) keeps it,
// reads no parts with the keys, and still reads them by name.
func TestGetGroupsWithParts(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "new", true: "created before"}[old], func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			if old {
				db, err := pebble.Open(dir, &pebble.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := db.Close(); err != nil {
					t.Fatal(err)
				}
			}
			s, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			if s.ReadsParts() == old || persistence.ReadsParts(s) == old {
				t.Fatalf("ReadsParts %v in a store created with the %s comparer", s.ReadsParts(), s.cmp.Name)
			}
			epochs := claim(t, s, 1, 2)
			appendOne(t, s, epochs, 1, 2)
			stored := map[uint32]map[string]string{
				1: {"p\x00a": "A", "p\x00a\x00b5": "A5", "p\x00a\x00b5p1": "A5.1", "p\x00ab": "AB", "p\x00ab\x00b1": "AB1",
					"p\x00c\x00b1": "orphan", "p\x00d": "D"},
				2: {"p\x00a": "A in 2", "p\x00a\x00b7": "A7 in 2"},
			}
			for g, snaps := range stored {
				var cd persistence.CheckpointData
				cd.Through = 1
				for k, v := range snaps {
					cd.Snapshots = append(cd.Snapshots, persistence.Snapshot{Key: k, Data: []byte(v)})
				}
				if err := s.Checkpoint(ctx, g, epochs[g], cd); err != nil {
					t.Fatal(err)
				}
			}
			reads := []persistence.GroupKeys{{Group: 1, Keys: []string{"p\x00ab", "p\x00a", "p\x00c", "p\x00d", "p\x00zz"}}, {Group: 2, Keys: []string{"p\x00a"}}}
			wantData := [][]string{{"AB", "A", "", "D", ""}, {"A in 2"}}
			wantParts := [][]string{{"p\x00ab\x00b1=AB1", "p\x00a\x00b5=A5 p\x00a\x00b5p1=A5.1", "", "", ""}, {"p\x00a\x00b7=A7 in 2"}}
			check := func(when string) {
				t.Helper()
				data, parts, err := s.GetGroupsWithParts(ctx, reads)
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				for r := range reads {
					for i, k := range reads[r].Keys {
						var got []string
						for _, p := range parts[r][i] {
							got = append(got, p.Key+"="+string(p.Data))
						}
						want := wantParts[r][i]
						if old {
							want = ""
						}
						if string(data[r][i]) != wantData[r][i] || strings.Join(got, " ") != want {
							t.Fatalf("%s: group %d key %q: %q, parts %q; want %q, %q", when, reads[r].Group, k, data[r][i], got, wantData[r][i], want)
						}
					}
				}
				// By name, as a store that does not read them.
				names := []string{"p\x00a\x00b5p1", "p\x00a\x00b5", "p\x00a\x00b6", "p\x00c\x00b1"}
				got, err := s.GetMany(ctx, 1, names)
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if w := []string{"A5.1", "A5", "", "orphan"}; !slices.Equal(strs(got), w) {
					t.Fatalf("%s: parts by name %q, want %q", when, strs(got), w)
				}
			}
			check("in the memtable")
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
			check("flushed")
			if err := s.db.Compact(ctx, []byte{kindSnapshot}, []byte{kindSnapshot + 1}, false); err != nil {
				t.Fatal(err)
			}
			check("compacted")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if s, err = Open(dir, Options{}); err != nil {
				t.Fatal(err)
			}
			if s.ReadsParts() == old {
				t.Fatalf("reopened, ReadsParts %v", s.ReadsParts())
			}
			check("reopened")
		})
	}
}

func strs(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

// TestGetGroupsWithPartsReportsAFailedRead: a table read failing while
// GetGroupsWithParts walks a key's parts fails the call; it must not read
// as a key with fewer parts (its remembered ids forgotten).
func TestGetGroupsWithPartsReportsAFailedRead(t *testing.T) {
	ctx := context.Background()
	var fault tableReadFault
	s := fault.open(t)
	epochs := claim(t, s, 1)
	appendOne(t, s, epochs, 1)
	value := func(k string) []byte { return bytes.Repeat([]byte(k[len(k)-1:]), 8<<10) }
	names := []string{"p\x00k", "p\x00k\x00b1", "p\x00k\x00b1p1", "p\x00k\x00b1p2", "p\x00k\x00b2"}
	var snaps []persistence.Snapshot
	for _, k := range names {
		snaps = append(snaps, persistence.Snapshot{Key: k, Data: value(k)})
	}
	if err := s.Checkpoint(ctx, 1, epochs[1], persistence.CheckpointData{Through: 1, Snapshots: snaps}); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	read := func() error {
		data, parts, err := s.GetGroupsWithParts(ctx, []persistence.GroupKeys{{Group: 1, Keys: names[:1]}})
		if err != nil {
			return err
		}
		if !bytes.Equal(data[0][0], value(names[0])) || len(parts[0][0]) != len(names)-1 {
			return fmt.Errorf("read %d bytes and %d parts, want %d parts", len(data[0][0]), len(parts[0][0]), len(names)-1)
		}
		for i, p := range parts[0][0] {
			if p.Key != names[i+1] || !bytes.Equal(p.Data, value(names[i+1])) {
				return fmt.Errorf("part %d is %q, want %q", i, p.Key, names[i+1])
			}
		}
		return nil
	}
	if err := read(); err != nil {
		t.Fatal(err)
	}
	if n := fault.failEach(t, read); n < len(names) {
		t.Fatalf("a call made %d table reads, want one per part at least (%d): the values are cached, not read", n, len(names))
	}
	if err := read(); err != nil {
		t.Fatalf("after the faults: %v", err)
	}
}
