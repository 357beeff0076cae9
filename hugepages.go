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
// 512 pages are all resident already (MADV_COLLAPSE, Linux 6.1). A window
// with a page the runtime returned to the kernel is left as it is: a
// collapse fills such holes, and the process would hold memory the
// runtime gave back (the bloat of golang/go#64332). So it adds no resident
// memory; what it costs is the copy of each window collapsed (a 2 MiB
// memcpy in the kernel) and a pass over the process's page map. At a
// million keys it took 9–14% off the CPU an event costs (BENCHMARKS.md,
// session 35).

// HugePageInterval is how often keyfold serve collapses its memory into
// huge pages (Config.HugePages).
const HugePageInterval = 10 * time.Second

// HugePageStats is what one pass of CollapseHugePages found and did.
type HugePageStats struct {
	// Windows are the 2 MiB windows whose pages were all resident, and
	// Collapsed those the kernel collapsed (or found collapsed already).
	Windows, Collapsed int
	// Failed are the windows the kernel could not collapse this time (no
	// free huge page, a page in use by I/O): the next pass tries again.
	Failed int
	// Took is how long the pass took.
	Took time.Duration
}

// ErrHugePagesUnsupported is returned by CollapseHugePages where the
// kernel cannot collapse memory on request (not Linux, Linux before 6.1,
// or a process with huge pages disabled).
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
		s, err := c.pass()
		if err != nil {
			return err
		}
		logger.Debug("huge pages", "windows", s.Windows, "collapsed", s.Collapsed, "failed", s.Failed, "took", s.Took)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
