package keyfold

import (
	"context"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeArea maps windows×2 MiB of private anonymous memory, an area of its
// own (mapWindows), and writes every page of it in small pages. It is
// unmapped when the test ends.
//
// A kernel whose policy is "always" backs a window with a huge page at its
// first fault: there the area refuses huge pages while it is written
// (MADV_NOHUGEPAGE), and is opened to them after (MADV_HUGEPAGE, which a
// collapse then needs). Not under "madvise": an area so advised is
// khugepaged's to collapse too, which was seen doing it before the test's
// pass.
func hugeArea(t *testing.T, windows int) []byte {
	t.Helper()
	a, unmap, err := mapWindows(windows)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmap() })
	always := strings.Contains(thpPolicy(), "[always]")
	if always {
		if err := unix.Madvise(a, unix.MADV_NOHUGEPAGE); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < len(a); i += smallPage {
		a[i] = 1
	}
	if always {
		if err := unix.Madvise(a, unix.MADV_HUGEPAGE); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// areaStats returns the resident bytes of the area starting at a's first
// byte, and those of it in huge pages, from /proc/self/smaps.
func areaStats(t *testing.T, a []byte) (rss, huge uint64) {
	t.Helper()
	all, err := readSmaps()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.start == uintptr(unsafe.Pointer(&a[0])) {
			return s.rss, s.huge
		}
	}
	t.Fatalf("no area at %p in /proc/self/smaps", &a[0])
	return 0, 0
}

// startsSmall fails the test unless the area starts with rss resident
// bytes, none of them in huge pages.
func startsSmall(t *testing.T, a []byte, rss uint64) {
	t.Helper()
	if r, huge := areaStats(t, a); r != rss || huge != 0 {
		t.Fatalf("the area starts with %d resident bytes, %d in huge pages: want %d, 0", r, huge, rss)
	}
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

// newTestCollapser opens a collapser whatever the kernel's policy (the
// tests check the mechanism; newCollapser's policy check is the
// operator's). A kernel that cannot collapse fails the test: keyfold's
// huge pages need Linux 6.1 with transparent huge pages.
func newTestCollapser(t *testing.T) *collapser {
	t.Helper()
	c, err := openCollapser()
	if err != nil {
		t.Fatalf("this kernel cannot collapse memory on request, which huge_pages needs (Linux 6.1 or later, with transparent huge pages): %v", err)
	}
	t.Cleanup(c.close)
	return c
}

func TestCollapseHugePages(t *testing.T) {
	c := newTestCollapser(t)
	a := hugeArea(t, 3)
	startsSmall(t, a, uint64(len(a)))
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
	startsSmall(t, a, full)
	rss, huge := collapseOnce(t, c, a, 2*hugePage)
	if rss != full {
		t.Errorf("after a pass the area has %d resident bytes, want %d: the hole was filled", rss, full)
	}
	if huge != 2*hugePage {
		t.Errorf("after a pass %d bytes of the area are in huge pages, want %d (the two whole windows)", huge, 2*hugePage)
	}
}

// A window the process has only read maps the kernel's zero page, which
// takes no memory: a collapse would give it 2 MiB of its own. Some kernels
// (seen on 6.18 under a Firecracker VM) have no zero page for it and give
// the page read memory of the process's own, resident: that window is
// collapsed like the others. Either way a pass collapses the resident
// windows and gives the area no memory it did not have.
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
	if rss, _ := areaStats(t, a); rss == uint64(len(a)) {
		t.Logf("this kernel (%s) backs the pages read with memory of the process's own, not the zero page", kernelRelease())
		written = rss
	}
	startsSmall(t, a, written)
	rss, huge := collapseOnce(t, c, a, written)
	if rss != written {
		t.Errorf("after a pass the area has %d resident bytes, want %d: the window only read took memory", rss, written)
	}
	if huge != written {
		t.Errorf("after a pass %d bytes of the area are in huge pages, want %d (the windows resident before)", huge, written)
	}
}

// kernelRelease returns the running kernel's release, for a message.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// A pass rests after each collapse that took time (the copy of a window,
// with the process's mmap lock held), not only at its end: every window
// of a fresh area is followed by a rest as long as its collapse took
// (which restAfterCollapse doubles), so that page faults waiting for the
// lock get it between two windows.
func TestCollapseRestsAfterEachCopy(t *testing.T) {
	c := newTestCollapser(t)
	rests := 0
	c.rest = func(context.Context, time.Duration) { rests++ }
	c.pauseAfter = 0 // (a copy's time depends on the machine: every collapse rests here)
	const windows = 4
	a := hugeArea(t, windows)
	startsSmall(t, a, uint64(len(a)))
	if _, huge := collapseOnce(t, c, a, uint64(len(a))); huge != uint64(len(a)) {
		t.Fatalf("the area has %d bytes in huge pages, want %d", huge, len(a))
	}
	if rests < windows {
		t.Fatalf("%d rests for a pass that collapsed %d fresh windows (and others), want one after each", rests, windows)
	}
}

// A collapse quicker than pauseAfter (a window collapsed already) is not
// followed by a rest.
func TestCollapseQuickNeedsNoRest(t *testing.T) {
	c := newTestCollapser(t)
	rests := 0
	c.rest = func(context.Context, time.Duration) { rests++ }
	c.pauseAfter = time.Hour
	a := hugeArea(t, 2)
	if _, huge := collapseOnce(t, c, a, uint64(len(a))); huge != uint64(len(a)) {
		t.Fatalf("the area has %d bytes in huge pages, want %d", huge, len(a))
	}
	if rests != 0 {
		t.Errorf("%d rests after collapses quicker than an hour", rests)
	}
}

// restAfterCollapse waits twice the collapse's time, and no longer once
// the pass's context ends.
func TestRestAfterCollapse(t *testing.T) {
	begin := time.Now()
	restAfterCollapse(context.Background(), 5*time.Millisecond)
	if d := time.Since(begin); d < 10*time.Millisecond {
		t.Errorf("rested %v after a collapse of 5ms, want at least 10ms", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	begin = time.Now()
	restAfterCollapse(ctx, time.Hour)
	if d := time.Since(begin); d > time.Second {
		t.Errorf("rested %v with the pass's context ended", d)
	}
}

// A pass ends at the window after its context ends, resting or not.
func TestCollapseStopsWhenCancelled(t *testing.T) {
	c := newTestCollapser(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rests := 0
	c.rest = func(context.Context, time.Duration) { rests++; cancel() }
	c.pauseAfter = 0
	hugeArea(t, 4)
	s, err := c.pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rests != 1 || s.windows != 1 {
		t.Errorf("a pass cancelled at its first rest went on: %d rests, %d windows", rests, s.windows)
	}
}
