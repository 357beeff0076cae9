package embedded

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/keyfold/keyfold/persistence"
)

// openSmall opens a store whose log segments roll over every size bytes.
func openSmall(t *testing.T, dir string, size int64) *Store {
	t.Helper()
	s, err := Open(dir, Options{segmentSize: size})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// segments lists the log's segment files.
func segments(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, segmentDir, "*"+segmentSuffix))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// readLog returns a group's records above after as "pos:data" strings.
func readLog(t *testing.T, s *Store, g uint32, after persistence.Position) []string {
	t.Helper()
	var got []string
	if err := s.Read(t.Context(), g, after, func(p persistence.Position, b []byte) error {
		got = append(got, fmt.Sprintf("%d:%s", p, b))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

func want(g uint32, from, through int) []string {
	var w []string
	for p := from; p <= through; p++ {
		w = append(w, fmt.Sprintf("%d:g%d-%d", p, g, p))
	}
	return w
}

func appendOne(t *testing.T, s *Store, epochs map[uint32]persistence.Epoch, groups ...uint32) {
	t.Helper()
	var entries []persistence.Entry
	for _, g := range groups {
		entries = append(entries, persistence.Entry{Group: g, Epoch: epochs[g]})
	}
	// Each entry's data names its position: the group's last one + 1.
	next := map[uint32]persistence.Position{}
	for i, e := range entries {
		if next[e.Group] == 0 {
			next[e.Group] = s.journal.last(e.Group)
			if st := s.group(e.Group); st.loaded {
				next[e.Group] = st.last
			}
		}
		next[e.Group]++
		entries[i].Data = fmt.Appendf(nil, "g%d-%d", e.Group, next[e.Group])
	}
	pos, err := s.Append(t.Context(), entries)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range entries {
		if fmt.Sprintf("g%d-%d", e.Group, pos[i]) != string(e.Data) {
			t.Fatalf("entry %q got position %d", e.Data, pos[i])
		}
	}
}

func claim(t *testing.T, s *Store, groups ...uint32) map[uint32]persistence.Epoch {
	t.Helper()
	epochs := map[uint32]persistence.Epoch{}
	for _, g := range groups {
		st, err := s.Claim(t.Context(), g)
		if err != nil {
			t.Fatal(err)
		}
		epochs[g] = st.Epoch
	}
	return epochs
}

// A segment is deleted once every group with records in it checkpointed
// through them, not before; the log reads the same after a reopen.
func TestLogSegmentsFollowCheckpoints(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := openSmall(t, dir, 1024)
	defer func() { _ = s.Close() }()
	epochs := claim(t, s, 1, 2)
	for range 200 { // ~80 bytes an append: ~16 segments
		appendOne(t, s, epochs, 1, 2, 1)
	}
	n := len(segments(t, dir))
	if n < 10 {
		t.Fatalf("%d segments, want many", n)
	}
	if err := s.Checkpoint(ctx, 1, epochs[1], persistence.CheckpointData{Through: 400}); err != nil {
		t.Fatal(err)
	}
	if got := len(segments(t, dir)); got != n {
		t.Errorf("after group 1's checkpoint: %d segments, want %d (group 2 has records in all)", got, n)
	}
	if err := s.Checkpoint(ctx, 2, epochs[2], persistence.CheckpointData{Through: 100}); err != nil {
		t.Fatal(err)
	}
	if got := len(segments(t, dir)); got >= n*3/4 || got <= n/4 {
		t.Errorf("after group 2's checkpoint through half: %d segments of %d, want about half", got, n)
	}
	if got := readLog(t, s, 2, 0); !slices.Equal(got, want(2, 101, 200)) {
		t.Errorf("group 2 = %v, want 101 to 200", got)
	}
	if got := readLog(t, s, 1, 0); got != nil {
		t.Errorf("group 1 = %v, want nothing above its checkpoint", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openSmall(t, dir, 1024)
	if got := readLog(t, s, 2, 100); !slices.Equal(got, want(2, 101, 200)) {
		t.Errorf("group 2 after a reopen = %v, want 101 to 200", got)
	}
	epochs = claim(t, s, 1, 2)
	appendOne(t, s, epochs, 2)
	if err := s.Checkpoint(ctx, 2, epochs[2], persistence.CheckpointData{Through: 201}); err != nil {
		t.Fatal(err)
	}
	if got := len(segments(t, dir)); got != 1 {
		t.Errorf("with every record checkpointed: %d segments, want 1 (the one written)", got)
	}
	if st, err := s.Claim(ctx, 1); err != nil || st.Last != 400 || st.Checkpoint != 400 {
		t.Errorf("claim of group 1 = %+v, %v; want last and checkpoint 400", st, err)
	}
}

// A torn block at the end of the last segment (a write cut by a crash) is
// cut off at the next open, durably: the records before it are there, the
// next append takes the torn one's position, and the segment reads clean
// once it is no longer the last.
func TestLogTornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(t *testing.T, name string)
		keep int
	}{
		{"half a block", func(t *testing.T, name string) {
			b, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(name, b[:len(b)-5], 0o644); err != nil {
				t.Fatal(err)
			}
		}, 19},
		{"garbage after the last block", func(t *testing.T, name string) {
			f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h := startBlock(nil, 1, 21) // a header whose block never made it
			h[4] = 200
			if _, err := f.Write(append(h, "partial"...)); err != nil {
				t.Fatal(err)
			}
		}, 20},
		{"zeros after the last block", func(t *testing.T, name string) {
			f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(make([]byte, 4096)); err != nil {
				t.Fatal(err)
			}
		}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openSmall(t, dir, 1<<20)
			epochs := claim(t, s, 1)
			for range 20 {
				appendOne(t, s, epochs, 1)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			segs := segments(t, dir)
			tc.tear(t, segs[len(segs)-1])

			s = openSmall(t, dir, 1<<20)
			if got := readLog(t, s, 1, 0); !slices.Equal(got, want(1, 1, tc.keep)) {
				t.Fatalf("after the tear: %v, want 1 to %d", got, tc.keep)
			}
			epochs = claim(t, s, 1)
			appendOne(t, s, epochs, 1)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openSmall(t, dir, 1<<20)
			defer func() { _ = s.Close() }()
			if got := readLog(t, s, 1, 0); !slices.Equal(got, want(1, 1, tc.keep+1)) {
				t.Fatalf("after the next reopen: %v, want 1 to %d", got, tc.keep+1)
			}
		})
	}
}

// An Append is one frame: torn anywhere (a kill can cut a large write
// short), it is dropped whole at the next open, for every group in it, and
// a batch of events spanning groups is in the log entirely or not at all.
func TestLogFrameAtomic(t *testing.T) {
	dir := t.TempDir()
	s := openSmall(t, dir, 1<<20)
	epochs := claim(t, s, 1, 2, 3)
	for range 6 {
		appendOne(t, s, epochs, 1, 2, 3)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs := segments(t, dir)
	name := segs[len(segs)-1]
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, b[:len(b)-3], 0o644); err != nil { // the last block of the last frame torn
		t.Fatal(err)
	}
	s = openSmall(t, dir, 1<<20)
	defer func() { _ = s.Close() }()
	for _, g := range []uint32{1, 2, 3} {
		if got := readLog(t, s, g, 0); !slices.Equal(got, want(g, 1, 5)) {
			t.Errorf("group %d = %v, want 1 to 5 (the torn append dropped for every group)", g, got)
		}
	}
}

// A bad block anywhere but at the end of the last segment, or a segment
// missing, is corruption: Open refuses the store rather than serve a log
// without acknowledged records.
func TestLogCorruptionRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, segs []string)
	}{
		{"a flipped byte in the first segment", func(t *testing.T, segs []string) {
			b, err := os.ReadFile(segs[0])
			if err != nil {
				t.Fatal(err)
			}
			b[blockHeaderLen+2] ^= 1
			if err := os.WriteFile(segs[0], b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"a segment removed", func(t *testing.T, segs []string) {
			if err := os.Remove(segs[1]); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openSmall(t, dir, 256)
			epochs := claim(t, s, 1)
			for range 50 {
				appendOne(t, s, epochs, 1)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			segs := segments(t, dir)
			if len(segs) < 4 {
				t.Fatalf("%d segments, want several", len(segs))
			}
			tc.break_(t, segs)
			s, err := Open(dir, Options{segmentSize: 256})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, errCorruptLog) {
				t.Fatalf("Open = %v, want a corrupt log", err)
			}
			t.Log(err)
		})
	}
}

// Concurrent appends of several groups (one call holding many), checkpoints
// and reads, with segments rolling over and deleted all the time: every
// group reads exactly its records above its checkpoint, also after a
// reopen.
func TestLogConcurrent(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	s := openSmall(t, dir, 2048)
	const writers, n = 4, 300
	groups := []uint32{0, 1, 2, 3}
	epochs := claim(t, s, groups...)
	checkpoints := make([]persistence.Position, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range uint32(writers) {
		wg.Go(func() {
			var last persistence.Position
			for i := range n {
				entries := []persistence.Entry{
					{Group: w, Epoch: epochs[w], Data: fmt.Appendf(nil, "g%d-%d", w, last+1)},
					{Group: w, Epoch: epochs[w], Data: fmt.Appendf(nil, "g%d-%d", w, last+2)},
				}
				pos, err := s.Append(ctx, entries)
				if err != nil {
					errs <- err
					return
				}
				if pos[0] != last+1 || pos[1] != last+2 {
					errs <- fmt.Errorf("group %d: positions %v after %d", w, pos, last)
					return
				}
				last += 2
				if i%25 == 24 {
					if err := s.Checkpoint(ctx, w, epochs[w], persistence.CheckpointData{Through: last - 7}); err != nil {
						errs <- err
						return
					}
					checkpoints[w] = last - 7
				}
				if i%10 == 0 {
					var got []persistence.Position
					if err := s.Read(ctx, w, checkpoints[w], func(p persistence.Position, _ []byte) error {
						got = append(got, p)
						return nil
					}); err != nil {
						errs <- err
						return
					}
					if len(got) != int(last-checkpoints[w]) || (len(got) > 0 && got[0] != checkpoints[w]+1) {
						errs <- fmt.Errorf("group %d read %d records from %v, want %d to %d", w, len(got), got[:min(1, len(got))], checkpoints[w]+1, last)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		for _, g := range groups {
			if got := readLog(t, s, g, 0); !slices.Equal(got, want(g, int(checkpoints[g])+1, 2*n)) {
				t.Fatalf("group %d = %d records, want %d to %d", g, len(got), checkpoints[g]+1, 2*n)
			}
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openSmall(t, dir, 2048)
	defer func() { _ = s.Close() }()
	check()
}

// A store of format 1 (its log in Pebble) is moved to the log segments at
// Open: the records above each checkpoint read the same, positions go on,
// and Pebble has no log record left.
func TestLogMigration(t *testing.T) {
	dir := t.TempDir()
	s := openSmall(t, dir, 512)
	// As a format 1 store had it: group 1 checkpointed through 2, records
	// 3 to 40; group 2 never checkpointed, records 1 to 3.
	b := s.db.NewBatch()
	for p := 3; p <= 40; p++ {
		_ = b.Set(logKey(1, persistence.Position(p)), fmt.Appendf(nil, "g1-%d", p), nil)
	}
	for p := 1; p <= 3; p++ {
		_ = b.Set(logKey(2, persistence.Position(p)), fmt.Appendf(nil, "g2-%d", p), nil)
	}
	_ = b.Set(checkpointKey(1), encodeUint64(2), nil)
	_ = b.Set(metaFormatKey, encodeUint64(1), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range segments(t, dir) { // a format 1 store has none
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
	}

	s = openSmall(t, dir, 512)
	defer func() { _ = s.Close() }()
	if got := readLog(t, s, 1, 0); !slices.Equal(got, want(1, 3, 40)) {
		t.Errorf("group 1 = %v, want 3 to 40", got)
	}
	if got := readLog(t, s, 2, 0); !slices.Equal(got, want(2, 1, 3)) {
		t.Errorf("group 2 = %v, want 1 to 3", got)
	}
	if len(segments(t, dir)) < 2 {
		t.Errorf("%d segments, want the records spread over several", len(segments(t, dir)))
	}
	epochs := claim(t, s, 1, 2)
	appendOne(t, s, epochs, 1, 2)
	if got := readLog(t, s, 1, 39); !slices.Equal(got, want(1, 40, 41)) {
		t.Errorf("group 1 after an append = %v, want 40 and 41", got)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindLog}, UpperBound: []byte{kindLog + 1}})
	if err != nil {
		t.Fatal(err)
	}
	if it.First() {
		t.Errorf("Pebble still holds log record %x", it.Key())
	}
	_ = it.Close()
	if v, err := getDecoded(s, metaFormatKey, decodeUint64); err != nil || v != formatVersion {
		t.Errorf("format = %d, %v; want %d", v, err, formatVersion)
	}
}

// TestFormatVersions: a format 2 to 6 store (its log already out of
// Pebble) is moved to the current format at its next open with its data as
// it was, and allows packed snapshots; a store of a format this build does
// not know is refused, unchanged.
func TestFormatVersions(t *testing.T) {
	for _, from := range []uint64{2, 3, 4, 5, 6} {
		t.Run(fmt.Sprint(from), func(t *testing.T) { testFormatVersionFrom(t, from) })
	}
}

func testFormatVersionFrom(t *testing.T, from uint64) {
	dir := t.TempDir()
	s := openSmall(t, dir, 512)
	epochs := claim(t, s, 1)
	appendOne(t, s, epochs, 1, 1, 1)
	if err := s.Checkpoint(t.Context(), 1, epochs[1], persistence.CheckpointData{Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("v")}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Set(metaFormatKey, encodeUint64(from), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openSmall(t, dir, 512)
	if v, err := getDecoded(s, metaFormatKey, decodeUint64); err != nil || v != formatVersion {
		t.Errorf("format = %d, %v; want %d", v, err, formatVersion)
	}
	if !persistence.AllowsPacked(s) || !persistence.HasIDIndex(s) {
		t.Errorf("a format %d store does not allow packed snapshots, or has no id index", formatVersion)
	}
	if got, err := s.Get(t.Context(), 1, "k"); err != nil || string(got) != "v" {
		t.Errorf("snapshot after the move = %q, %v", got, err)
	}
	if got := readLog(t, s, 1, 0); len(got) != 3 {
		t.Errorf("log after the move = %v, want 3 records", got)
	}
	if err := s.db.Set(metaFormatKey, encodeUint64(formatVersion+1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(dir, Options{}); !errors.Is(err, persistence.ErrIncompatible) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open of a format %d store: %v, want ErrIncompatible", formatVersion+1, err)
	}
}

// FuzzScanBlocks: whatever a segment holds, the scan does not panic, keeps
// a prefix of whole frames whose blocks decode, and scanning that prefix
// again finds the same blocks.
func FuzzScanBlocks(f *testing.F) {
	var seg []byte
	for range 2 {
		var fb frameBuilder
		for g := range uint32(3) {
			if err := errors.Join(fb.add(g, 7, []byte("a record")), fb.add(g, 8, nil)); err != nil {
				f.Fatal(err)
			}
		}
		if err := fb.finish(); err != nil {
			f.Fatal(err)
		}
		seg = append(seg, fb.buf...)
	}
	f.Add(seg)
	f.Add(seg[:len(seg)-3])
	f.Add(append(slices.Clone(seg), make([]byte, 64)...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		type block struct {
			off int64
			h   blockHeader
			r   string
		}
		scan := func(b []byte) ([]block, int64) {
			var blocks []block
			good, err := scanBlocks(bytes.NewReader(b), int64(len(b)), func(off int64, h blockHeader, records []byte) error {
				if off < 0 || off+int64(h.len) > int64(len(b)) {
					t.Fatalf("block at %d of %d bytes outside the segment of %d", off, h.len, len(b))
				}
				if _, _, err := decodeBlock(b[off : off+int64(h.len)]); err != nil {
					t.Fatalf("block at %d passed the scan but does not decode: %v", off, err)
				}
				blocks = append(blocks, block{off, h, string(records)})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if good < 0 || good > int64(len(b)) {
				t.Fatalf("prefix %d of %d bytes", good, len(b))
			}
			return blocks, good
		}
		blocks, good := scan(b)
		again, good2 := scan(b[:good])
		if good2 != good || !slices.Equal(blocks, again) {
			t.Fatalf("the prefix scans differently: %d blocks to %d, %d to %d", len(blocks), good, len(again), good2)
		}
	})
}
