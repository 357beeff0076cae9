//go:build !unix

package embedded

import "github.com/cockroachdb/pebble/v2/vfs"

// mapTables returns fs: tables are read through mappings only on Unix
// systems (mapped.go).
func mapTables(fs vfs.FS, _ *mapRefusals) vfs.FS { return fs }
