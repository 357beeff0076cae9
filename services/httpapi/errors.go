package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

// statusTable translates domain errors to HTTP statuses, first match wins.
var statusTable = []struct {
	err    error
	status int
}{
	{ErrBadBody, http.StatusBadRequest},
	{ErrBusy, http.StatusServiceUnavailable},
	{fold.ErrInvalidEvent, http.StatusBadRequest},
	{actors.ErrUnknownPipeline, http.StatusNotFound},
	{actors.ErrNotFound, http.StatusNotFound},
	{actors.ErrClosed, http.StatusServiceUnavailable},
	{actors.ErrUnavailable, http.StatusServiceUnavailable},
	{actors.ErrFailed, http.StatusServiceUnavailable},
	{actors.ErrNotReady, http.StatusServiceUnavailable},
	{context.DeadlineExceeded, http.StatusGatewayTimeout},
	{context.Canceled, 499}, // client closed the request (nginx's convention)
}

// ErrBadBody wraps every error decoding a request body.
var ErrBadBody = errors.New("httpapi: bad request body")

func statusOf(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	for _, e := range statusTable {
		if errors.Is(err, e.err) {
			return e.status
		}
	}
	return http.StatusInternalServerError
}
