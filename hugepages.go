package keyfold

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Huge pages for a node's memory.
//
// A node with many keys reads its memory at random: a key's grain, the
// registry's and the snapshot cache's index entries, the collector's span
// of each pointer it marks. Beyond the CPU's caches each such read is a
// miss, and with the kernel's 4 KiB pages most are a TLB miss as well, a
// page-table walk that misses too. The Go runtime leaves its heap to the
// kernel's transparent huge page policy (since Go 1.21.1 it neither asks
// for huge pages nor refuses them), and a kernel whose policy is
// "madvise", as many distributions ship, then backs the heap with 4 KiB
// pages only.
//
// So keyfold serve asks the kernel, every HugePageInterval, to collapse
// into one 2 MiB page each aligned 2 MiB window of the process's private
// anonymous memory (the Go heap, fastcache's chunks, C allocations) whose
// 512 pages are all resident and its own already (MADV_COLLAPSE, Linux
// 6.1). A collapse fills a window's missing pages, and turns pages only
// read (the kernel's shared zero page) into memory: so a window with a
// page the runtime returned to the kernel, or one not yet written, is left
// as it is, and the process does not take back memory the runtime gave
// back (the bloat of golang/go#64332). The one exception is a race: a page
// returned between the check and the collapse is filled, at most a window
// at a time, until the runtime uses it again. What it costs is the copy
// of each window collapsed (2 MiB in the kernel, with its mmap lock held,
// and the compaction it may take to find a free huge page; the pass rests
// after each, restAfterCollapse) and a pass over the process's page map.
// At a million keys it took 11–17% off the node's CPU per event over
// gRPC, 12% in process (BENCHMARKS.md, session 35). A kernel whose policy
// is "never" is left alone.

// HugePageInterval is how often keyfold serve collapses its memory into
// huge pages (Config.HugePages).
const HugePageInterval = 10 * time.Second

// hugePageStats is what one pass of CollapseHugePages found and did.
type hugePageStats struct {
	// windows are the 2 MiB windows whose pages were all resident, and
	// collapsed those the kernel collapsed, or found collapsed already.
	windows, collapsed int
	// failed are the windows the kernel could not collapse this time (no
	// free huge page, a page in use by I/O): the next pass tries again.
	failed int
	took   time.Duration
}

// ErrHugePagesUnsupported is returned by CollapseHugePages where the
// kernel cannot or is not to collapse memory on request: not Linux, Linux
// before 6.1 or without transparent huge pages, a process with huge pages
// disabled, or a kernel whose policy is "never" (MADV_COLLAPSE would
// collapse still; the operator's choice holds).
var ErrHugePagesUnsupported = errors.New("keyfold: huge pages: the kernel does not collapse memory on request (MADV_COLLAPSE, Linux 6.1)")

// CollapseHugePages collapses the process's fully resident 2 MiB windows
// of anonymous memory into huge pages now and then every interval, until
// ctx ends (it then returns nil), logging each pass at debug level. It
// returns ErrHugePagesUnsupported at once where that cannot be done. New
// never calls it, as it never calls ApplyGoRuntime: a program that embeds
// a Node owns its process, and may run it if the node is what the process
// is for; keyfold serve runs it unless Config.HugePages is "off".
func CollapseHugePages(ctx context.Context, interval time.Duration, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = HugePageInterval
	}
	c, err := newCollapser()
	if err != nil {
		return err
	}
	defer c.close()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		// (A pass fails only reading /proc: it is tried again.)
		if s, err := c.pass(ctx); err != nil {
			logger.Warn("huge pages: pass failed", "err", err)
		} else {
			logger.Debug("huge pages", "windows", s.windows, "collapsed", s.collapsed, "failed", s.failed, "took", s.took)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
