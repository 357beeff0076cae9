package embedded_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
)

// fullFS is the real filesystem with a disk that can be made full: writes
// fail with ENOSPC while full is on (for the files whose name has suffix),
// and statfs reports avail bytes free.
type fullFS struct {
	*errorfs.FS
	avail atomic.Int64
}

func newFullFS(suffix string, full *atomic.Bool, lockErr error) *fullFS {
	f := &fullFS{}
	f.avail.Store(1 << 30)
	f.FS = errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpLock:
			return lockErr
		case errorfs.OpFileWrite, errorfs.OpFileWriteAt, errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpCreate:
			if full.Load() && strings.HasSuffix(op.Path, suffix) {
				return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
			}
		}
		return nil
	}))
	return f
}

func (f *fullFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	a := uint64(f.avail.Load())
	return vfs.DiskUsage{AvailBytes: a, TotalBytes: 1 << 30, UsedBytes: 1<<30 - a}, nil
}

func record(i int) []byte { return fmt.Appendf(nil, "record %d", i) }

// readAll returns the group's log.
func readAll(t *testing.T, s *embedded.Store, g uint32) (pos []persistence.Position, data [][]byte) {
	t.Helper()
	err := s.Read(context.Background(), g, 0, func(p persistence.Position, b []byte) error {
		pos, data = append(pos, p), append(data, bytes.Clone(b))
		return nil
	})
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return pos, data
}

// Below the reserve, appends are refused with ErrNoSpace and nothing
// written; the store stays usable and appends resume when space is freed.
func TestDiskReserveRefusesAppends(t *testing.T) {
	ctx := context.Background()
	var full atomic.Bool
	fs := newFullFS("", &full, nil)
	s, err := embedded.OpenFS(t.TempDir(), embedded.Options{DiskReserve: 1 << 20}, fs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(1)}}); err != nil {
		t.Fatal(err)
	}
	fs.avail.Store(1<<20 - 1)
	pos, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(2)}})
	if !errors.Is(err, persistence.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) || pos[0] != 0 {
		t.Fatalf("append below the reserve = %v, %v; want ErrNoSpace and ENOSPC", pos, err)
	}
	if err := s.AppendOutputs(ctx, []persistence.Output{{Pipeline: "p", Data: []byte("x")}}); !errors.Is(err, persistence.ErrNoSpace) {
		t.Fatalf("append outputs below the reserve = %v, want ErrNoSpace", err)
	}
	if d := s.Disk(); !d.Full || d.FreeBytes != 1<<20-1 || d.ReserveBytes != 1<<20 || d.Failed != nil {
		t.Errorf("Disk() = %+v, want full", d)
	}
	// Claims and reads go on.
	if st, err = s.Claim(ctx, 1); err != nil {
		t.Fatalf("claim below the reserve: %v", err)
	}
	if p, _ := readAll(t, s, 1); len(p) != 1 {
		t.Fatalf("log has %d records, want the one acknowledged", len(p))
	}
	// All but full: claims and checkpoints are refused too, before they
	// could fail and break the store.
	fs.avail.Store(1000)
	if _, err := s.Claim(ctx, 1); !errors.Is(err, persistence.ErrNoSpace) {
		t.Fatalf("claim on an all but full disk = %v, want ErrNoSpace", err)
	}
	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 1}); !errors.Is(err, persistence.ErrNoSpace) {
		t.Fatalf("checkpoint on an all but full disk = %v, want ErrNoSpace", err)
	}
	if d := s.Disk(); d.Failed != nil {
		t.Fatalf("Disk() = %+v: the store broke", d)
	}
	// A write that would go below the reserve is refused too.
	fs.avail.Store(1<<20 + 10)
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: make([]byte, 100)}}); !errors.Is(err, persistence.ErrNoSpace) {
		t.Fatalf("append crossing the reserve = %v, want ErrNoSpace", err)
	}
	fs.avail.Store(1 << 30)
	pos, err = s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(3)}})
	if err != nil || pos[0] != 2 {
		t.Fatalf("append after freeing space = %v, %v; want position 2", pos, err)
	}
	if d := s.Disk(); d.Full {
		t.Errorf("Disk() = %+v after freeing space, want not full", d)
	}
}

// openFull is openWithRecords on a fullFS failing writes of files with
// suffix.
func openFull(t *testing.T, suffix string, n int) (*embedded.Store, string, *atomic.Bool, persistence.GroupState) {
	t.Helper()
	full := new(atomic.Bool)
	s, dir, st := openWithRecords(t, newFullFS(suffix, full, nil), n)
	return s, dir, full, st
}

// openWithRecords opens a store on fs, claims group 1 and appends records
// 0 to n-1 to it.
func openWithRecords(t *testing.T, fs vfs.FS, n int) (*embedded.Store, string, persistence.GroupState) {
	t.Helper()
	dir := t.TempDir()
	s, err := embedded.OpenFS(dir, embedded.Options{}, fs)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := s.Append(t.Context(), []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	return s, dir, st
}

// reclaim claims group 1 once the failed store has reopened.
func reclaim(t *testing.T, s *embedded.Store) persistence.GroupState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.Claim(t.Context(), 1)
		if err == nil {
			return st
		}
		if !errors.Is(err, embedded.ErrFailed) || time.Now().After(deadline) {
			t.Fatalf("claim after the disk was freed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A log write that fails with ENOSPC (the space went between the check and
// the write) fails the call and breaks the store, which reopens itself once
// writes work again: nothing acknowledged is lost, the failed record is in
// the log at most once, and appends go on after it.
func TestDiskFullLogWriteRecovers(t *testing.T) {
	ctx := context.Background()
	s, dir, full, st := openFull(t, ".seg", 10)
	defer s.Close()
	var acked [][]byte
	for i := range 10 {
		acked = append(acked, record(i))
	}
	full.Store(true)
	failed := record(10)
	_, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: failed}})
	if !errors.Is(err, embedded.ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk = %v, want ErrFailed wrapping ENOSPC", err)
	}
	if _, err := s.Claim(ctx, 1); !errors.Is(err, embedded.ErrFailed) {
		t.Fatalf("claim of a failed store = %v, want ErrFailed", err)
	}
	if d := s.Disk(); !d.Full || d.Failed == nil {
		t.Errorf("Disk() = %+v, want full and failed", d)
	}
	full.Store(false)
	st = reclaim(t, s)
	pos, data := readAll(t, s, 1)
	if len(data) < len(acked) || len(data) > len(acked)+1 {
		t.Fatalf("log has %d records after the reopen, want %d or %d", len(data), len(acked), len(acked)+1)
	}
	for i, d := range acked {
		if !bytes.Equal(data[i], d) || pos[i] != persistence.Position(i+1) {
			t.Fatalf("record %d = %d %q, want %d %q", i, pos[i], data[i], i+1, d)
		}
	}
	if len(data) > len(acked) && !bytes.Equal(data[len(acked)], failed) {
		t.Fatalf("record after the acknowledged ones = %q, want the failed one or none", data[len(acked)])
	}
	p, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(11)}})
	if err != nil || p[0] != pos[len(pos)-1]+1 {
		t.Fatalf("append after the reopen = %v, %v; want position %d", p, err, pos[len(pos)-1]+1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, data2 := readAll(t, s2, 1); len(data2) != len(data)+1 {
		t.Fatalf("log has %d records after a restart, want %d", len(data2), len(data)+1)
	}
}

// A log sync that fails (EIO) after its write went through: the record is
// in the page cache, maybe not on disk, and a later fdatasync could report
// success without writing it. The store fails, and its reopen cuts the log
// where its last successful sync ended: the failed record is gone, every
// acknowledged one is there, and the next append takes its position.
func TestLogSyncFailureCutsUnsynced(t *testing.T) {
	ctx := t.Context()
	var fail atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileSyncData && fail.Load() && strings.HasSuffix(op.Path, ".seg") {
			return &os.PathError{Op: "fdatasync", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	}))
	s, _, st := openWithRecords(t, fs, 5)
	defer s.Close()
	fail.Store(true)
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(5)}}); !errors.Is(err, embedded.ErrFailed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("append whose sync fails = %v, want ErrFailed wrapping EIO", err)
	}
	fail.Store(false)
	st = reclaim(t, s)
	if st.Last != 5 {
		t.Errorf("last position after the reopen = %d, want 5 (the unsynced record cut)", st.Last)
	}
	pos, data := readAll(t, s, 1)
	if len(data) != 5 || pos[4] != 5 || !bytes.Equal(data[4], record(4)) {
		t.Fatalf("log after the reopen: %d records, last at %v; want records 0 to 4 at 1 to 5", len(data), pos)
	}
	if p, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(6)}}); err != nil || p[0] != 6 {
		t.Fatalf("append after the reopen = %v, %v; want position 6", p, err)
	}
}

// A checkpoint whose Pebble WAL write fails with ENOSPC breaks the store
// the same way: once it has reopened, the checkpoint is there entirely
// (snapshot and position) or not at all, the log above the checkpoint is
// whole, and appends go on at the next position.
func TestDiskFullWALWriteRecovers(t *testing.T) {
	ctx := context.Background()
	s, _, full, st := openFull(t, ".log", 10)
	defer s.Close()
	full.Store(true)
	err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 6, Snapshots: []persistence.Snapshot{{Key: "k", Data: []byte("v")}}})
	if !errors.Is(err, embedded.ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("checkpoint on a full disk = %v, want ErrFailed wrapping ENOSPC", err)
	}
	full.Store(false)
	st = reclaim(t, s)
	_, snapErr := s.Get(ctx, 1, "k")
	switch {
	case st.Checkpoint == 6 && snapErr == nil, st.Checkpoint == 0 && errors.Is(snapErr, persistence.ErrNotFound):
	default:
		t.Fatalf("after the reopen: checkpoint %d, snapshot error %v; want both or neither", st.Checkpoint, snapErr)
	}
	pos, data := readAll(t, s, 1)
	if len(pos) != int(10-st.Checkpoint) || pos[0] != st.Checkpoint+1 {
		t.Fatalf("log after the reopen: positions %v, want %d to 10", pos, st.Checkpoint+1)
	}
	for i, p := range pos {
		if !bytes.Equal(data[i], record(int(p)-1)) {
			t.Fatalf("record %d = %q, want %q", p, data[i], record(int(p)-1))
		}
	}
	if p, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(10)}}); err != nil || p[0] != 11 {
		t.Fatalf("append after the reopen = %v, %v; want position 11", p, err)
	}
}

// Open on a disk below the reserve fails at once, naming the directory and
// ENOSPC; Open whose log recovery (a flush) runs out of space fails too,
// instead of waiting for Pebble's retries forever.
func TestOpenFullDisk(t *testing.T) {
	ctx := context.Background()
	var full atomic.Bool
	fs := newFullFS(".sst", &full, nil)
	dir := t.TempDir()
	s, err := embedded.OpenFS(dir, embedded.Options{DiskReserve: 1 << 20}, fs)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: record(1)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	fs.avail.Store(1000)
	_, err = embedded.OpenFS(dir, embedded.Options{DiskReserve: 1 << 20}, fs)
	if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "ENOSPC") {
		t.Fatalf("open below the reserve = %v, want an error naming %s and ENOSPC", err, dir)
	}

	fs.avail.Store(1 << 30)
	full.Store(true) // the flush of the recovered log fails
	opened := make(chan error, 1)
	go func() {
		s, err := embedded.OpenFS(dir, embedded.Options{DiskReserve: 1 << 20}, fs)
		if err == nil {
			s.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) {
			t.Fatalf("open whose flush fails = %v, want an error naming %s and ENOSPC", err, dir)
		}
	case <-time.After(10 * time.Second):
		full.Store(false)
		t.Fatal("open whose flush fails hangs")
	}
	full.Store(false)
	// The abandoned open finishes and lets the directory go.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := embedded.OpenFS(dir, embedded.Options{DiskReserve: 1 << 20}, fs)
		if err == nil {
			if p, _ := readAll(t, s, 1); len(p) != 1 {
				t.Errorf("log has %d records, want 1", len(p))
			}
			s.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open after the disk was freed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A directory that cannot be written is not reported as one in use.
func TestOpenNotWritable(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EROFS, syscall.EACCES} {
		var full atomic.Bool
		fs := newFullFS("", &full, &os.PathError{Op: "open", Path: "LOCK", Err: errno})
		_, err := embedded.OpenFS(t.TempDir(), embedded.Options{}, fs)
		if err == nil || strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "not writable") || !errors.Is(err, errno) {
			t.Errorf("open with %v on the lock = %v, want 'not writable'", errno, err)
		}
	}
}

// On a real read-only filesystem (where the test may mount one), Open says
// the directory is not writable.
func TestOpenReadOnlyFilesystem(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("cannot mount a tmpfs to remount read-only (%v: %s): this test needs root, as .ci/run has (run make test as root)", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	s, err := embedded.Open(dir, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "remount,ro", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount read-only: %v: %s", err, out)
	}
	_, err = embedded.Open(dir, embedded.Options{})
	if err == nil || strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "not writable") || !errors.Is(err, syscall.EROFS) {
		t.Errorf("open on a read-only filesystem = %v, want 'not writable' and EROFS", err)
	}
}
