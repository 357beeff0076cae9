package keyfold

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// residentFileCollector exports the part of the process's resident memory
// that maps files (RssFile): the embedded store's tables, which it reads
// through mappings (embedded.Options.PreadTables), and the binary's own
// pages. process_resident_memory_bytes includes it; it is page cache,
// which the kernel may reclaim, not the node's heap. Where the process's
// status cannot be read (not Linux) it returns nil.
func residentFileCollector() prometheus.Collector {
	self, err := procfs.Self()
	if err != nil {
		return nil
	}
	rssFile := func() (float64, error) {
		st, err := self.NewStatus()
		return float64(st.RssFile), err
	}
	if _, err := rssFile(); err != nil {
		return nil
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keyfold_process_resident_file_bytes",
		Help: "Resident memory of the process that maps files (RssFile): mostly the embedded store's tables, read through mappings; page cache the kernel may reclaim. Included in process_resident_memory_bytes.",
	}, func() float64 {
		v, _ := rssFile()
		return v
	})
}
