package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
)

// Options configures a Store. The zero value is a sane default.
type Options struct {
	// Logger receives the store's log messages and Pebble's: Pebble's
	// informational messages at debug level, its errors (background errors,
	// detected corruption) at error level. Nil discards them.
	//
	// Pebble treats some failures as fatal, a failed WAL write among them,
	// because it cannot continue safely: the store logs those at error level
	// and panics, where Pebble's own default would exit the process.
	Logger *slog.Logger

	// CacheSize is the size of Pebble's block cache in bytes (0 means 64 MiB).
	CacheSize int64

	// MemTableSize is the size of one Pebble memtable in bytes (0 means
	// 32 MiB); up to two are held in memory. Larger memtables flush less
	// often. It must be below 4 GiB.
	MemTableSize uint64
}

const (
	defaultCacheSize    = 64 << 20
	defaultMemTableSize = 32 << 20
	maxMemTableSize     = 4 << 30
)

// Validate reports every problem with the options at once.
func (o Options) Validate() error {
	var errs []error
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("embedded: CacheSize %d is negative", o.CacheSize))
	}
	if o.MemTableSize >= maxMemTableSize {
		errs = append(errs, fmt.Errorf("embedded: MemTableSize %d is not below 4 GiB", o.MemTableSize))
	}
	return errors.Join(errs...)
}

// withDefaults returns the options with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CacheSize == 0 {
		o.CacheSize = defaultCacheSize
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = defaultMemTableSize
	}
	return o
}

// pebbleOptions returns the Pebble options for a store.
func (o Options) pebbleOptions() *pebble.Options {
	log := pebbleLogger{o.Logger}
	return &pebble.Options{
		Logger:       log,
		CacheSize:    o.CacheSize,
		MemTableSize: o.MemTableSize,
		// Pinned rather than FormatNewest, so that upgrading Pebble does not
		// silently ratchet the on-disk format (which cannot be undone).
		FormatMajorVersion: pebble.FormatValueSeparation,
		EventListener: &pebble.EventListener{
			BackgroundError: func(err error) {
				o.Logger.Error("pebble background error", "err", err)
			},
			// The read that found the corruption fails too; Pebble's default
			// would end the process.
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				o.Logger.Error("pebble data corruption", "err", info.String())
			},
		},
	}
}

// pebbleLogger routes Pebble's logging to a slog.Logger.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l.Enabled(context.Background(), slog.LevelDebug) {
		p.l.Debug("pebble", "detail", fmt.Sprintf(format, args...))
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble error", "err", fmt.Sprintf(format, args...))
}

// Fatalf logs and panics: Pebble calls it when it cannot go on and expects
// it not to return.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error("pebble fatal error", "err", msg)
	panic("embedded: pebble: " + msg)
}
