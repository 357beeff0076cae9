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
}

// newCollapser returns a collapser if the kernel collapses memory on
// request for this process: it collapses a window of its own to find out.
// That answers for the kernel's version, its configuration and a process
// with huge pages disabled (prctl PR_SET_THP_DISABLE) alike.
func newCollapser() (*collapser, error) {
	if strconv.IntSize != 64 || os.Getpagesize() != smallPage || pmdSize() != hugePage {
		return nil, fmt.Errorf("%w: %d-bit, pages of %d bytes, huge pages of %d", ErrHugePagesUnsupported, strconv.IntSize, os.Getpagesize(), pmdSize())
	}
	if policy := thpPolicy(); strings.Contains(policy, "[never]") {
		// MADV_COLLAPSE would still collapse: the operator's word is
		// what holds.
		return nil, fmt.Errorf("%w: the kernel's policy is %q", ErrHugePagesUnsupported, policy)
	}
	if err := probeCollapse(); err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHugePagesUnsupported, err)
	}
	return &collapser{pagemap: f}, nil
}

func (c *collapser) close() { c.pagemap.Close() }

// probeCollapse collapses one written window of a mapping of its own.
func probeCollapse() error {
	m, err := unix.Mmap(-1, 0, 2*hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("keyfold: huge pages: probe: %w", err)
	}
	defer unix.Munmap(m)
	// The aligned window inside the mapping.
	w := (uintptr(unsafe.Pointer(&m[0])) + hugePage - 1) &^ (hugePage - 1)
	off := int(w - uintptr(unsafe.Pointer(&m[0])))
	for i := off; i < off+hugePage; i += smallPage {
		m[i] = 1
	}
	switch _, _, errno := unix.Syscall(unix.SYS_MADVISE, w, hugePage, unix.MADV_COLLAPSE); errno {
	case 0, unix.EAGAIN, unix.ENOMEM, unix.EBUSY:
		// (No huge page free now, or a page busy: the kernel knows the
		// advice, and the passes try again.)
		return nil
	default:
		return fmt.Errorf("%w: %w (the kernel's policy: %s)", ErrHugePagesUnsupported, errno, thpPolicy())
	}
}

// pass collapses every window of the process's private anonymous memory
// whose pages are all resident and the process's own, until ctx ends. A
// pass stops at the first window the kernel had no huge page for (ENOMEM,
// or EBUSY: the cgroup's limit): it would reclaim for every window after
// it; the next pass tries again.
func (c *collapser) pass(ctx context.Context) (hugePageStats, error) {
	begin := time.Now()
	var s hugePageStats
	areas, err := c.areas()
	if err != nil {
		return s, err
	}
	for _, a := range areas {
		if ctx.Err() != nil {
			break
		}
		for w := a.start; w+hugePage <= a.end; w += hugePage {
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
			_, _, errno := unix.Syscall(unix.SYS_MADVISE, w, hugePage, unix.MADV_COLLAPSE)
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
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHugePagesUnsupported, err)
	}
	defer f.Close()
	var (
		out       []area
		cur       area
		candidate bool
		rss, huge uint64
	)
	flush := func() {
		if candidate && rss >= huge+hugePage {
			start := (cur.start + hugePage - 1) &^ (hugePage - 1)
			end := cur.end &^ (hugePage - 1)
			if start < end {
				out = append(out, area{start, end})
			}
		}
		candidate, rss, huge = false, 0, 0
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 0 && isHex(line[0]):
			// "start-end perms offset dev inode [path]": an area's header.
			flush()
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
			cur = area{uintptr(start), uintptr(end)}
			// Private, read-write, not a file's (inode 0): unnamed,
			// the brk heap, or named by its owner ("[anon: Go: heap]",
			// where the kernel keeps names); not "[stack]" or the
			// kernel's own.
			candidate = string(fs[1]) == "rw-p" && string(fs[4]) == "0" &&
				(len(fs) == 5 || string(fs[5]) == "[heap]" || bytes.HasPrefix(fs[5], []byte("[anon:")))
		case bytes.HasPrefix(line, []byte("Rss:")):
			rss = kiB(line)
		case bytes.HasPrefix(line, []byte("AnonHugePages:")):
			huge = kiB(line)
		case bytes.HasPrefix(line, []byte("VmFlags:")):
			for _, fl := range bytes.Fields(line[len("VmFlags:"):]) {
				// nh: MADV_NOHUGEPAGE; gd: grows down (a stack).
				if string(fl) == "nh" || string(fl) == "gd" {
					candidate = false
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("keyfold: huge pages: read /proc/self/smaps: %w", err)
	}
	flush()
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
