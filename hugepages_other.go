//go:build !linux

package keyfold

import (
	"fmt"
	"runtime"
)

type collapser struct{}

func newCollapser() (*collapser, error) {
	return nil, fmt.Errorf("%w: %s", ErrHugePagesUnsupported, runtime.GOOS)
}

func (c *collapser) close() {}

func (c *collapser) pass() (HugePageStats, error) { return HugePageStats{}, nil }
