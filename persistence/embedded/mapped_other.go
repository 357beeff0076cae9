//go:build !unix

package embedded

import (
	"log/slog"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// mapTables returns fs: tables are read through mappings only on Unix
// systems (mapped.go).
func mapTables(fs vfs.FS, _ *mapRefusals) vfs.FS { return fs }

// mapRefusals counts nothing where no table is mapped (mapped.go).
type mapRefusals struct {
	n   atomic.Int64
	log *slog.Logger
}
