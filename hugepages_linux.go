package keyfold

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	smallPage = 4 << 10
	hugePage  = 2 << 20
	// pagesPerHuge is the small pages of one huge page: the page map
	// entries of one window.
	pagesPerHuge = hugePage / smallPage
	// A page map entry's bits (Documentation/admin-guide/mm/pagemap.rst):
	// the page is resident; it is mapped by this process alone. A page
	// only read so far maps the kernel's shared zero page, present but
	// not exclusive: a collapse would turn it into memory of its own.
	pagePresent   = 1 << 63
	pageExclusive = 1 << 56
)

// collapser collapses the process's memory into huge pages
// (CollapseHugePages).
type collapser struct {
	pagemap *os.File
	entries []byte // read buffer of page map entries, reused
	// rest is called after a collapse that took longer than pauseAfter,
	// with how long it took (restAfterCollapse, collapsePauseAfter; tests
	// record the calls).
	rest       func(ctx context.Context, took time.Duration)
	pauseAfter time.Duration
}

// newCollapser returns a collapser if the kernel collapses memory on
// request for this process and its policy is not "never".
func newCollapser() (*collapser, error) {
	if strconv.IntSize != 64 || os.Getpagesize() != smallPage || pmdSize() != hugePage {
		return nil, fmt.Errorf("%w: %d-bit, pages of %d bytes, huge pages of %d", ErrHugePagesUnsupported, strconv.IntSize, os.Getpagesize(), pmdSize())
	}
	if policy := thpPolicy(); strings.Contains(policy, "[never]") {
		// MADV_COLLAPSE would still collapse: the operator's word is
		// what holds.
		return nil, fmt.Errorf("%w: the kernel's policy is %q", ErrHugePagesUnsupported, policy)
	}
	return openCollapser()
}

// openCollapser returns a collapser if the kernel collapses memory on
// request for this process, whatever its policy: it collapses a window of
// its own to find out. That answers for the kernel's version, its
// configuration and a process with huge pages disabled (prctl
// PR_SET_THP_DISABLE) alike.
func openCollapser() (*collapser, error) {
	if err := probeCollapse(); err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHugePagesUnsupported, err)
	}
	return &collapser{pagemap: f, rest: restAfterCollapse, pauseAfter: collapsePauseAfter}, nil
}

func (c *collapser) close() { c.pagemap.Close() }

// probeCollapse collapses one written window of a mapping of its own.
func probeCollapse() error {
	w, unmap, err := mapWindows(1)
	if err != nil {
		return fmt.Errorf("keyfold: huge pages: probe: %w", err)
	}
	defer unmap()
	for i := 0; i < len(w); i += smallPage {
		w[i] = 1
	}
	switch _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(unsafe.Pointer(&w[0])), hugePage, unix.MADV_COLLAPSE); errno {
	case 0, unix.EAGAIN, unix.ENOMEM, unix.EBUSY:
		// (No huge page free now, or a page busy: the kernel knows the
		// advice, and the passes try again.)
		return nil
	default:
		return fmt.Errorf("%w: %w (the kernel's policy: %s)", ErrHugePagesUnsupported, errno, thpPolicy())
	}
}

// mapWindows maps n aligned 2 MiB windows of private anonymous memory, an
// area of their own: the rest of the mapping around them is PROT_NONE, a
// page at least on each side, so the kernel merges them with no neighbour.
// (Where the kernel aligned the mapping to 2 MiB, as recent kernels do
// with large anonymous mappings, none was left before them: the windows
// merged with the mapping below now and then, and the tests found no area
// of their own in smaps.) unmap
// unmaps all of it.
func mapWindows(n int) (w []byte, unmap func() error, err error) {
	m, err := unix.Mmap(-1, 0, (n+1)*hugePage+smallPage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, err
	}
	unmap = func() error { return unix.Munmap(m) }
	base := uintptr(unsafe.Pointer(&m[0]))
	off := int((base+smallPage+hugePage-1)&^(hugePage-1) - base)
	end := off + n*hugePage
	for _, r := range [][]byte{m[:off], m[end:]} {
		if len(r) == 0 {
			continue
		}
		if err := unix.Mprotect(r, unix.PROT_NONE); err != nil {
			unmap()
			return nil, nil, err
		}
	}
	return m[off:end:end], unmap, nil
}

// collapsePauseAfter is how long a collapse takes before the pass rests
// after it, twice as long (restAfterCollapse). A collapse that copies a
// window holds the process's mmap lock for writing while it copies, and
// every page fault of every thread waits for it; back to back, a pass's
// hundreds of collapses stalled a node's acks every HugePageInterval at
// half load (BENCHMARKS.md, session 55). One that finds the window
// collapsed already takes microseconds: no rest.
const collapsePauseAfter = 100 * time.Microsecond

// restAfterCollapse waits twice as long as a collapse took, or until ctx
// ends, so that the threads waiting for the mmap lock get it: while it
// copies windows, a pass holds the lock about a third of the time.
func restAfterCollapse(ctx context.Context, took time.Duration) {
	t := time.NewTimer(2 * took)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pass collapses every window of the process's private anonymous memory
// whose pages are all resident and the process's own, until ctx ends,
// resting after each collapse that copied (c.rest). A pass stops at the
// first window the kernel had no huge page for (ENOMEM, or EBUSY: the
// cgroup's limit): it would reclaim for every window after it; the next
// pass tries again.
func (c *collapser) pass(ctx context.Context) (hugePageStats, error) {
	begin := time.Now()
	var s hugePageStats
	areas, err := c.areas()
	if err != nil {
		return s, err
	}
windows:
	for _, a := range areas {
		for w := a.start; w+hugePage <= a.end; w += hugePage {
			if ctx.Err() != nil {
				break windows
			}
			whole, err := c.whole(w)
			if err != nil {
				return s, err
			}
			if !whole {
				continue
			}
			s.windows++
			// (A page the runtime gives back between the check and the
			// collapse is filled by it: the one window's bound on
			// memory added, until the runtime uses the page again.)
			t := time.Now()
			_, _, errno := unix.Syscall(unix.SYS_MADVISE, w, hugePage, unix.MADV_COLLAPSE)
			took := time.Since(t)
			switch errno {
			case 0:
				s.collapsed++
			case unix.ENOMEM, unix.EBUSY:
				s.failed++
				s.took = time.Since(begin)
				return s, nil
			default:
				// EAGAIN (a page busy now), EINVAL (a window the kernel
				// will not collapse: the probe showed it collapses
				// others): the next pass tries again.
				s.failed++
			}
			if took > c.pauseAfter {
				c.rest(ctx, took)
			}
		}
	}
	s.took = time.Since(begin)
	return s, nil
}

// area is a range of the process's memory, aligned to huge pages inward.
type area struct{ start, end uintptr }

// areas returns the process's private anonymous read-write areas that
// hold at least one resident window of small pages: their resident memory
// (Rss) beyond what is in huge pages already (AnonHugePages) is a window
// or more. (The Go runtime reserves far more address space than it maps;
// those reservations are not read-write, and are skipped with the rest.)
func (c *collapser) areas() ([]area, error) {
	all, err := readSmaps()
	if err != nil {
		return nil, err
	}
	var out []area
	for _, a := range all {
		if !a.anonymous || a.rss < a.huge+hugePage {
			continue
		}
		start := (a.start + hugePage - 1) &^ (hugePage - 1)
		if end := a.end &^ (hugePage - 1); start < end {
			out = append(out, area{start, end})
		}
	}
	return out, nil
}

// smapsArea is an area of the process's memory as /proc/self/smaps lists
// it.
type smapsArea struct {
	start, end uintptr
	// anonymous: private, read-write, not a file's and not a stack, and
	// open to huge pages (not MADV_NOHUGEPAGE).
	anonymous bool
	rss, huge uint64 // resident bytes, and those in huge pages
}

// readSmaps returns the areas of /proc/self/smaps.
func readSmaps() ([]smapsArea, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHugePagesUnsupported, err)
	}
	defer f.Close()
	var (
		out []smapsArea
		cur *smapsArea // nil: a header this does not parse, and its fields
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 0 && isHex(line[0]):
			// "start-end perms offset dev inode [path]": an area's header.
			cur = nil
			fs := bytes.Fields(line)
			if len(fs) < 5 {
				continue
			}
			se := bytes.SplitN(fs[0], []byte("-"), 2)
			if len(se) != 2 {
				continue
			}
			start, err1 := strconv.ParseUint(string(se[0]), 16, 64)
			end, err2 := strconv.ParseUint(string(se[1]), 16, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			// Private, read-write, not a file's (inode 0): unnamed,
			// the brk heap, or named by its owner ("[anon: Go: heap]",
			// where the kernel keeps names); not "[stack]" or the
			// kernel's own.
			out = append(out, smapsArea{start: uintptr(start), end: uintptr(end),
				anonymous: string(fs[1]) == "rw-p" && string(fs[4]) == "0" &&
					(len(fs) == 5 || string(fs[5]) == "[heap]" || bytes.HasPrefix(fs[5], []byte("[anon:")))})
			cur = &out[len(out)-1]
		case cur == nil:
		case bytes.HasPrefix(line, []byte("Rss:")):
			cur.rss = kiB(line)
		case bytes.HasPrefix(line, []byte("AnonHugePages:")):
			cur.huge = kiB(line)
		case bytes.HasPrefix(line, []byte("VmFlags:")):
			for _, fl := range bytes.Fields(line[len("VmFlags:"):]) {
				// nh: MADV_NOHUGEPAGE; gd: grows down (a stack).
				if string(fl) == "nh" || string(fl) == "gd" {
					cur.anonymous = false
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("keyfold: huge pages: read /proc/self/smaps: %w", err)
	}
	return out, nil
}

// whole reports whether every page of the window at w is resident and
// the process's own (not the shared zero page of memory only read).
func (c *collapser) whole(w uintptr) (bool, error) {
	if cap(c.entries) < 8*pagesPerHuge {
		c.entries = make([]byte, 8*pagesPerHuge)
	}
	b := c.entries[:8*pagesPerHuge]
	// (An area unmapped since smaps listed it reads as not present.)
	if n, err := c.pagemap.ReadAt(b, int64(w/smallPage)*8); n < len(b) {
		return false, fmt.Errorf("keyfold: huge pages: read /proc/self/pagemap: %w", err)
	}
	for i := 0; i < len(b); i += 8 {
		if e := binary.LittleEndian.Uint64(b[i:]); e&pagePresent == 0 || e&pageExclusive == 0 {
			return false, nil
		}
	}
	return true, nil
}

// thpPolicy returns the kernel's transparent huge page policy as its
// settings file says it ("always madvise [never]"), for an error message.
func thpPolicy() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return "unknown"
	}
	return string(bytes.TrimSpace(b))
}

// pmdSize returns the size of the kernel's transparent huge pages (0 if
// it has none).
func pmdSize() int {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(string(bytes.TrimSpace(b)))
	return n
}

// kiB parses the "NAME:   N kB" lines of smaps, in bytes.
func kiB(line []byte) uint64 {
	fs := bytes.Fields(line)
	if len(fs) < 2 {
		return 0
	}
	v, _ := strconv.ParseUint(string(fs[1]), 10, 64)
	return v << 10
}

func isHex(b byte) bool { return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' }
