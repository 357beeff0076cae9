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
	var fault tableReadFault
	s := fault.open(t)
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
	n := fault.failEach(t, func() error {
		_, err := s.GetMany(ctx, 1, keys)
		return err
	})
	if n < len(keys) {
		t.Fatalf("a call made %d table reads, want one per key at least (%d): the values are cached, not read", n, len(keys))
	}
	if _, err := check(); err != nil {
		t.Fatalf("after the faults: %v", err)
	}
}

// tableReadFault is a filesystem (fs) whose table reads fail one at a
// time: once armed, the table read after skip more fails, and only that
// one.
type tableReadFault struct {
	armed atomic.Bool
	skip  atomic.Int64
}

// open opens a store on the filesystem with a block cache too small to
// keep a block: every key's read goes to its table (with values large
// enough for a data block each).
func (f *tableReadFault) open(t *testing.T) *Store {
	t.Helper()
	s, err := OpenFS(t.TempDir(), Options{CacheSize: 1}, f.fs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (f *tableReadFault) fs() vfs.FS {
	return errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if f.armed.Load() && op.Kind == errorfs.OpFileReadAt && strings.HasSuffix(op.Path, ".sst") && f.skip.Add(-1) == -1 {
			f.armed.Store(false)
			return errors.New("injected table read error")
		}
		return nil
	}))
}

// failEach fails the first table read of call, then its second, and so
// on, until a call makes fewer reads; each call with a failed read must
// fail (an error, not a key read as never stored or with fewer parts). It
// returns the reads of a call.
func (f *tableReadFault) failEach(t *testing.T, call func() error) int {
	t.Helper()
	for n := 0; ; n++ {
		f.skip.Store(int64(n))
		f.armed.Store(true)
		err := call()
		if f.armed.Swap(false) {
			return n // no n-th read: every read of a call has failed once
		}
		if err == nil {
			t.Fatalf("table read %d failed unreported", n)
		}
	}
}
