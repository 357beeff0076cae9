package embedded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/keyfold/keyfold/persistence"
)

// TestGetManyReportsAFailedRead: GetMany reads its keys with one iterator,
// and each seek clears the error of the one before. A table read failing for
// one key in the middle of a call must fail the call, not make that key read
// as never stored (a new key: its state lost) while later keys read fine.
func TestGetManyReportsAFailedRead(t *testing.T) {
	ctx := context.Background()
	// When armed, the table read after skip more fails, and only that one.
	var (
		armed atomic.Bool
		skip  atomic.Int64
	)
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind == errorfs.OpFileReadAt && strings.HasSuffix(op.Path, ".sst") && skip.Add(-1) == -1 {
			armed.Store(false)
			return errors.New("injected table read error")
		}
		return nil
	}))
	// A block cache too small to keep a block: every key's read goes to its
	// table, whose values are large enough for a data block each.
	s, err := OpenFS(t.TempDir(), Options{CacheSize: 1}, fs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	value := func(k int) []byte { return bytes.Repeat([]byte{byte(k)}, 8<<10) }
	var snaps []persistence.Snapshot
	keys := make([]string, 8)
	for k := range keys {
		keys[k] = fmt.Sprintf("k%d", k)
		snaps = append(snaps, persistence.Snapshot{Key: keys[k], Data: value(k)})
	}
	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 1, Snapshots: snaps}); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flush(); err != nil { // into a table: reads go to the file
		t.Fatal(err)
	}
	check := func() ([][]byte, error) {
		got, err := s.GetMany(ctx, 1, keys)
		if err != nil {
			return nil, err
		}
		for k, v := range got {
			if !bytes.Equal(v, value(k)) {
				return got, fmt.Errorf("key %s: %d bytes, want %d", keys[k], len(v), len(value(k)))
			}
		}
		return got, nil
	}
	if _, err := check(); err != nil { // (and the table is open)
		t.Fatal(err)
	}
	// Fail the call's first table read, then its second, and so on, until
	// a call makes fewer reads: whichever key's read fails, the call fails.
	n := 0
	for ; ; n++ {
		skip.Store(int64(n))
		armed.Store(true)
		got, err := s.GetMany(ctx, 1, keys)
		if armed.Swap(false) {
			break // no n-th read: every read of a call has failed once
		}
		if err == nil {
			t.Fatalf("table read %d failed unreported: %d values read, one key's as never stored", n, len(got))
		}
	}
	if n < len(keys) {
		t.Fatalf("a call made %d table reads, want one per key at least (%d): the values are cached, not read", n, len(keys))
	}
	if _, err := check(); err != nil {
		t.Fatalf("after the faults: %v", err)
	}
}
