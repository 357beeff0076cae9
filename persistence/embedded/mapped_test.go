//go:build unix

package embedded

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// writeTable writes n random bytes to a file named like a table and
// returns its path and contents.
func writeTable(t *testing.T, n int) (string, []byte) {
	t.Helper()
	data := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(t.TempDir(), "000001.sst")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func TestMappedTableReads(t *testing.T) {
	const size = 3*4096 + 123
	path, data := writeTable(t, size)
	fs := mapTables(vfs.Default, nil)
	f, err := fs.Open(path, vfs.RandomReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := f.(*mappedFile); !ok {
		t.Fatalf("a table opened for random reads is a %T, not mapped", f)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		off := r.IntN(size)
		p := make([]byte, 1+r.IntN(8192))
		n, err := f.ReadAt(p, int64(off))
		want := data[off:min(off+len(p), size)]
		if n != len(want) || !bytes.Equal(p[:n], want) {
			t.Fatalf("ReadAt(%d bytes, %d) = %d bytes, not the file's %d", len(p), off, n, len(want))
		}
		if (n < len(p)) != (err == io.EOF) || (err != nil && err != io.EOF) {
			t.Fatalf("ReadAt(%d bytes, %d) = %d, %v", len(p), off, n, err)
		}
	}
	if n, err := f.ReadAt(make([]byte, 1), size); n != 0 || err != io.EOF {
		t.Fatalf("ReadAt at the end = %d, %v; want io.EOF", n, err)
	}
	if _, err := f.ReadAt(make([]byte, 1), -1); err == nil {
		t.Fatal("ReadAt at a negative offset returned no error")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	// What is not a table, or is opened for sequential reads (a
	// compaction's), is read by pread.
	for _, o := range []vfs.OpenOption{vfs.SequentialReadsOption, nil} {
		var opts []vfs.OpenOption
		if o != nil {
			opts = append(opts, o)
		}
		f, err := fs.Open(path, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.(*mappedFile); ok {
			t.Fatalf("a table opened with %v is mapped", opts)
		}
		f.Close()
	}
	other := filepath.Join(t.TempDir(), "MANIFEST-000001")
	if err := os.WriteFile(other, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := fs.Open(other, vfs.RandomReadsOption); err != nil {
		t.Fatal(err)
	} else if _, ok := f.(*mappedFile); ok {
		t.Fatal("a file that is not a table is mapped")
	} else {
		f.Close()
	}
	// A filesystem other than the disk's (a test's faults) is left alone.
	if mem := vfs.NewMem(); mapTables(mem, nil) != mem {
		t.Fatal("an in-memory filesystem maps tables")
	}
	// A read larger than largeRead goes to the file.
	f, err = fs.Open(path, vfs.RandomReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	os.Truncate(path, 0) // (the mapping now faults, the file reads nothing)
	if n, err := f.ReadAt(make([]byte, largeRead+1), 0); n != 0 || err != io.EOF {
		t.Fatalf("a large read of an emptied table = %d, %v; want the file's io.EOF", n, err)
	}
}

// A page the mapping cannot read (here: the file truncated under it, as a
// stand-in for a disk's I/O error) is the read's error, not a crash.
func TestMappedTableFault(t *testing.T) {
	path, _ := writeTable(t, 4*4096)
	f, err := mapTables(vfs.Default, nil).Open(path, vfs.RandomReadsOption)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 100)
	if _, err := f.ReadAt(p, 0); err != nil {
		t.Fatalf("reading the page left: %v", err)
	}
	n, err := f.ReadAt(p, 2*4096)
	if err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "000001.sst") {
		t.Fatalf("reading a page the file lost = %d, %v; want the fault as an error naming the table", n, err)
	}
	t.Log(err)
	// The goroutine's own setting is back (this test's had none).
	if debug.SetPanicOnFault(false) {
		t.Fatal("ReadAt left the goroutine's faults as panics")
	}
}
