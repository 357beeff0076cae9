package keyfold

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// residentFileCollector exports the part of the process's resident memory
// that maps files (RssFile): the embedded store's tables, which it reads
// through mappings (embedded.Options.PreadTables), and the binary's own
// pages. process_resident_memory_bytes includes it; it is the page cache's
// memory, which the kernel reclaims under pressure, not the node's heap.
// Where the process's status cannot be read (not Linux) it returns nil.
func residentFileCollector() prometheus.Collector {
	if p, err := procfs.Self(); err != nil {
		return nil
	} else if _, err := p.NewStatus(); err != nil {
		return nil
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keyfold_process_resident_file_bytes",
		Help: "Resident memory of the process that maps files (RssFile): mostly the embedded store's tables, read through mappings; page cache the kernel may reclaim. Included in process_resident_memory_bytes.",
	}, func() float64 {
		p, err := procfs.Self()
		if err != nil {
			return 0
		}
		st, err := p.NewStatus()
		if err != nil {
			return 0
		}
		return float64(st.RssFile)
	})
}
