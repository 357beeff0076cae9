package keyfold

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

const (
	smallPage = 4 << 10
	hugePage  = 2 << 20
	// pagesPerHuge is the small pages of one huge page: the page map
	// entries of one window.
	pagesPerHuge = hugePage / smallPage
	// pagePresent is the page map's bit of a resident page
	// (Documentation/admin-guide/mm/pagemap.rst).
	pagePresent = 1 << 63
)

// collapser collapses the process's memory into huge pages
// (CollapseHugePages).
type collapser struct {
	pagemap *os.File
	entries []byte // read buffer of page map entries, reused
	// collapsed says a collapse has succeeded before: from then on an
	// EINVAL is one window's, not the kernel's refusal of the advice.
	collapsed bool
}

func newCollapser() (*collapser, error) {
	if os.Getpagesize() != smallPage {
		return nil, fmt.Errorf("%w: pages of %d bytes", ErrHugePagesUnsupported, os.Getpagesize())
	}
	// A process with huge pages disabled (prctl PR_SET_THP_DISABLE, which
	// a parent may set for its children) is refused every collapse.
	if v, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0); err == nil && v != 0 {
		return nil, fmt.Errorf("%w: disabled for this process (PR_SET_THP_DISABLE)", ErrHugePagesUnsupported)
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHugePagesUnsupported, err)
	}
	return &collapser{pagemap: f}, nil
}

func (c *collapser) close() { c.pagemap.Close() }

// pass collapses every window of the process's private anonymous memory
// whose pages are all resident. It fails only if the kernel does not
// collapse memory at all.
func (c *collapser) pass() (HugePageStats, error) {
	begin := time.Now()
	var s HugePageStats
	areas, err := c.areas()
	if err != nil {
		return s, err
	}
	for _, a := range areas {
		for w := a.start; w+hugePage <= a.end; w += hugePage {
			resident, err := c.resident(w)
			if err != nil {
				return s, err
			}
			if !resident {
				continue
			}
			s.Windows++
			_, _, errno := unix.Syscall(unix.SYS_MADVISE, w, hugePage, unix.MADV_COLLAPSE)
			switch errno {
			case 0:
				s.Collapsed++
				c.collapsed = true
			case unix.EINVAL:
				// Before Linux 6.1 the advice is unknown, as it is to a
				// kernel without transparent huge pages; later, a window
				// of an area that refuses huge pages (MADV_NOHUGEPAGE,
				// which areas() skips, set since it read them) is
				// refused so.
				if !c.collapsed {
					return s, fmt.Errorf("%w: %w (the kernel's policy: %s)", ErrHugePagesUnsupported, errno, thpPolicy())
				}
				s.Failed++
			default:
				// EAGAIN (a page busy, a transient), ENOMEM (no huge
				// page free now): the next pass tries again.
				s.Failed++
			}
		}
	}
	s.Took = time.Since(begin)
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

// resident reports whether every page of the window at w is resident.
func (c *collapser) resident(w uintptr) (bool, error) {
	if cap(c.entries) < 8*pagesPerHuge {
		c.entries = make([]byte, 8*pagesPerHuge)
	}
	b := c.entries[:8*pagesPerHuge]
	// (An area unmapped since smaps listed it reads as not present.)
	if n, err := c.pagemap.ReadAt(b, int64(w/smallPage)*8); n < len(b) {
		return false, fmt.Errorf("keyfold: huge pages: read /proc/self/pagemap: %w", err)
	}
	for i := 0; i < len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:])&pagePresent == 0 {
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
