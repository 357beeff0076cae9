package redisstore

import (
	"errors"
	"fmt"
	"strings"
)

// Options configures a Store. The zero value is a sane default.
type Options struct {
	// Prefix starts every key the store writes ("keyfold" if empty), so
	// that several deployments can share one Redis. It may not contain
	// braces, which would break the hash tags (see keys.go).
	Prefix string

	// ReadPageSize is the number of log records Read fetches per round trip
	// (0 means 128), and of timer index entries Timers fetches.
	ReadPageSize int
}

const (
	defaultPrefix   = "keyfold"
	defaultReadPage = 128
)

// Validate reports every problem with the options at once.
func (o Options) Validate() error {
	var errs []error
	if strings.ContainsAny(o.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("redisstore: prefix %q contains a brace", o.Prefix))
	}
	if o.ReadPageSize < 0 {
		errs = append(errs, fmt.Errorf("redisstore: ReadPageSize %d is negative", o.ReadPageSize))
	}
	return errors.Join(errs...)
}

func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if o.ReadPageSize == 0 {
		o.ReadPageSize = defaultReadPage
	}
	return o
}

func errBadID(id string) error {
	return fmt.Errorf("log entry ID %q is not a keyfold position (the key is not keyfold's?)", id)
}
