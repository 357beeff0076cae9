package keyfold

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeArea maps windows×2 MiB of private anonymous memory, aligned to huge
// pages, as an area of its own (its neighbours, the rest of the mapping,
// are PROT_NONE, so the kernel merges it with nothing), and touches every
// page of it. It is unmapped when the test ends.
func hugeArea(t *testing.T, windows int) []byte {
	t.Helper()
	n := windows * hugePage
	m, err := unix.Mmap(-1, 0, n+2*hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	base := uintptr(unsafe.Pointer(&m[0]))
	off := int((base+hugePage-1)&^(hugePage-1) - base)
	if err := unix.Mprotect(m[:off], unix.PROT_NONE); err != nil && off > 0 {
		t.Fatal(err)
	}
	if err := unix.Mprotect(m[off+n:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	a := m[off : off+n : off+n]
	for i := 0; i < n; i += smallPage {
		a[i] = 1
	}
	return a
}

// areaStats returns the resident bytes of the area starting at a's first
// byte, and those of it in huge pages, from /proc/self/smaps.
func areaStats(t *testing.T, a []byte) (rss, huge uint64) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(&a[0])))
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case len(line) > 0 && isHex(line[0]):
			in = strings.HasPrefix(line, want)
		case in && strings.HasPrefix(line, "Rss:"):
			rss = kiB([]byte(line))
		case in && strings.HasPrefix(line, "AnonHugePages:"):
			huge = kiB([]byte(line))
		}
	}
	return rss, huge
}

// collapseOnce runs passes until the area's expected windows are collapsed
// (a window can fail now and then: a page busy, no huge page free), at most
// three.
func collapseOnce(t *testing.T, c *collapser, a []byte, want uint64) (rss, huge uint64) {
	t.Helper()
	for range 3 {
		s, err := c.pass(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if rss, huge = areaStats(t, a); huge >= want {
			return rss, huge
		}
		t.Logf("pass: %+v; area: %d resident bytes, %d in huge pages", s, rss, huge)
	}
	return rss, huge
}

func newTestCollapser(t *testing.T) *collapser {
	t.Helper()
	c, err := newCollapser()
	if errors.Is(err, ErrHugePagesUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

func TestCollapseHugePages(t *testing.T) {
	c := newTestCollapser(t)
	a := hugeArea(t, 3)
	if rss, huge := areaStats(t, a); rss != uint64(len(a)) || huge != 0 {
		// (A kernel whose policy is "always" backs it with huge pages at
		// once: nothing to show here.)
		t.Skipf("the area starts with %d resident bytes, %d in huge pages: want %d, 0", rss, huge, len(a))
	}
	rss, huge := collapseOnce(t, c, a, uint64(len(a)))
	if huge != uint64(len(a)) || rss != uint64(len(a)) {
		t.Fatalf("after a pass the area has %d resident bytes, %d in huge pages; want %d in huge pages", rss, huge, len(a))
	}
}

// A window with a page the process gave back stays as it is: a collapse
// would fill the hole, and the process would hold memory it returned.
func TestCollapseHugePagesLeavesHoles(t *testing.T) {
	c := newTestCollapser(t)
	a := hugeArea(t, 3)
	// The second window gives back one page, as the Go runtime's
	// scavenger does.
	hole := a[hugePage+5*smallPage : hugePage+6*smallPage]
	if err := unix.Madvise(hole, unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	full := uint64(len(a) - smallPage)
	if rss, huge := areaStats(t, a); rss != full || huge != 0 {
		t.Skipf("the area starts with %d resident bytes, %d in huge pages: want %d, 0", rss, huge, full)
	}
	rss, huge := collapseOnce(t, c, a, 2*hugePage)
	if rss != full {
		t.Errorf("after a pass the area has %d resident bytes, want %d: the hole was filled", rss, full)
	}
	if huge != 2*hugePage {
		t.Errorf("after a pass %d bytes of the area are in huge pages, want %d (the two whole windows)", huge, 2*hugePage)
	}
}

// A window the process has only read maps the kernel's zero page, which
// takes no memory: a collapse would give it 2 MiB of its own.
func TestCollapseHugePagesLeavesPagesOnlyRead(t *testing.T) {
	c := newTestCollapser(t)
	a := hugeArea(t, 3)
	// The middle window given back and read again: the zero page.
	if err := unix.Madvise(a[hugePage:2*hugePage], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	var sum byte
	for i := hugePage; i < 2*hugePage; i += smallPage {
		sum += a[i]
	}
	if sum != 0 {
		t.Fatalf("pages given back read %d", sum)
	}
	written := uint64(2 * hugePage)
	if rss, huge := areaStats(t, a); rss != written || huge != 0 {
		t.Skipf("the area starts with %d resident bytes, %d in huge pages: want %d, 0", rss, huge, written)
	}
	rss, huge := collapseOnce(t, c, a, written)
	if rss != written {
		t.Errorf("after a pass the area has %d resident bytes, want %d: the window only read took memory", rss, written)
	}
	if huge != written {
		t.Errorf("after a pass %d bytes of the area are in huge pages, want %d (the two windows written)", huge, written)
	}
}
