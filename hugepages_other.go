//go:build !linux

package keyfold

import (
	"context"
	"fmt"
	"runtime"
)

type collapser struct{}

func newCollapser() (*collapser, error) {
	return nil, fmt.Errorf("%w: %s", ErrHugePagesUnsupported, runtime.GOOS)
}

func (c *collapser) close() {}

func (c *collapser) pass(context.Context) (hugePageStats, error) { return hugePageStats{}, nil }
