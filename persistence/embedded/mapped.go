//go:build unix

package embedded

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"
)

// Tables read through a mapping of their file.
//
// A snapshot read that misses Pebble's block cache reads a block of 4 KiB
// from the table's file: a pread(2) each, from the page cache once the
// machine has seen the file. With many more keys than the node holds in
// memory that is most events' read, and on a virtual machine a system call
// costs microseconds (ten million keys: the store's reads were 45% of the
// node's CPU, pread alone 8%; BENCHMARKS.md, session 52). A table is
// immutable once written, so the store maps it when Pebble opens it for
// reads (as RocksDB's allow_mmap_reads does), and a block read is a copy
// from the mapping: the first read of a page faults it in (with the pages
// around it that the page cache holds), later ones cost no kernel entry.
//
// Only what Pebble opens for random reads (point reads, iterators) is
// mapped; a compaction reopens its inputs for sequential reads, and reads
// their data blocks by pread with the kernel's readahead. A mapping that
// cannot be made (the process's limit of mappings) leaves the file read
// by pread, as does a filesystem that is not the disk (a test's fault
// injection) and a 32-bit process (its address space). A table the kernel
// refuses to map is counted (DiskStats.UnmappedTables) and logged as a
// warning, at most once a minute: its reads cost a system call each, and a
// node that reaches vm.max_map_count (ENOMEM) at ten million keys would
// otherwise slow down without a word. madvise(MADV_RANDOM)
// keeps a fault from reading ahead of a block that is not cached, as
// Pebble's fadvise does for pread (RocksDB does the same); a read larger
// than largeRead (a table's filter, its top-level index, its properties,
// read once into the block cache) goes to the file, one system call where
// a cold page cache would fault page by page. An iterator that reads
// sequentially gets readahead(2) from Pebble (options.go).
//
// A page that cannot be read (an I/O error on the disk; a file truncated
// under the mapping, which Pebble never does) is a SIGBUS where pread would
// have returned EIO. ReadAt asks the runtime for a panic instead of a crash
// (debug.SetPanicOnFault) and returns it as the read's error, so a failing
// disk fails the read that met it, as it would without the mapping.

// mappedFS maps the tables that Pebble opens for random reads (see above).
type mappedFS struct {
	vfs.FS
	refused *mapRefusals
}

// mapWarnEvery is the least time between two warnings of refused mappings.
const mapWarnEvery = time.Minute

// refuse counts a table that could not be mapped, and warns.
func (r *mapRefusals) refuse(name string, err error) {
	if r == nil {
		return
	}
	n := r.n.Add(1)
	if ok, _ := r.limit.allow(mapWarnEvery); !ok || r.log == nil {
		return
	}
	attrs := []any{"table", name, "err", err, "refused_since_open", n}
	if errors.Is(err, unix.ENOMEM) {
		attrs = append(attrs, "hint", "the process may have as many mappings as vm.max_map_count allows (sysctl vm.max_map_count): each table open for reads is a mapping")
	}
	r.log.Warn("embedded: a table could not be mapped; it is read by pread instead, a system call per block read", attrs...)
}

// mmap maps a file for mapFile (a variable for the tests' refusals).
var mmap = unix.Mmap

// largeRead is the largest read served from a mapping.
const largeRead = 64 << 10

// mapTables returns fs with its tables read through mappings, or fs itself
// where that is not done: any filesystem but the disk's, and a 32-bit
// process. The tables the kernel refuses to map are counted in refused.
func mapTables(fs vfs.FS, refused *mapRefusals) vfs.FS {
	if fs != vfs.Default || strconv.IntSize < 64 {
		return fs
	}
	return mappedFS{fs, refused}
}

func (f mappedFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.Open(name, opts...)
	if err != nil || !strings.HasSuffix(name, ".sst") || !slices.Contains(opts, vfs.RandomReadsOption) {
		return file, err
	}
	return mapFile(file, name, f.refused), nil
}

// mapFile returns file (at path) read through a mapping of it, or file
// itself if it cannot be mapped (the kernel's refusal is counted in
// refused).
func mapFile(file vfs.File, path string, refused *mapRefusals) vfs.File {
	fd := file.Fd()
	if fd == vfs.InvalidFd {
		return file
	}
	info, err := file.Stat()
	if err != nil || info.Size() <= 0 {
		return file
	}
	m, err := mmap(int(fd), 0, int(info.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		refused.refuse(path, err)
		return file
	}
	_ = unix.Madvise(m, unix.MADV_RANDOM) // (advice: nothing to do if refused)
	return &mappedFile{File: file, m: m, name: info.Name()}
}

// mappedFile is a table read through a mapping of its file. Reads other
// than ReadAt (Pebble makes none on a table it opened for random reads) go
// to the file.
type mappedFile struct {
	vfs.File
	m    []byte
	name string
}

var errNegativeOffset = errors.New("embedded: read at a negative offset")

// ReadAt copies from the mapping (a read larger than largeRead reads the
// file). A fault there (see above) is returned as an error.
func (f *mappedFile) ReadAt(p []byte, off int64) (n int, err error) {
	if off < 0 {
		return 0, errNegativeOffset
	}
	if len(p) > largeRead {
		return f.File.ReadAt(p, off)
	}
	if off >= int64(len(f.m)) {
		return 0, io.EOF
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			n, err = 0, fmt.Errorf("embedded: reading table %s at offset %d: its mapping faulted (a disk I/O error, or the file shrank): %v", f.name, off, r)
		}
	}()
	n = copy(p, f.m[off:])
	if n < len(p) {
		err = io.EOF
	}
	return n, err
}

// Close unmaps the file, then closes it.
func (f *mappedFile) Close() error {
	err := unix.Munmap(f.m)
	f.m = nil
	return errors.Join(err, f.File.Close())
}
