package httpapi

import (
	"errors"
	"net/http"

	"github.com/keyfold/keyfold/services"
)

// ErrBadBody wraps every error decoding a request body.
var ErrBadBody = services.ErrBadRequest

// ErrBusy reports an ingest that found no slot before its context ended.
var ErrBusy = services.ErrBusy

// Errors of HTTP alone (gRPC has no such requests).
var (
	// ErrSlowBody reports a request body that did not arrive before its
	// deadline (Options.MinBodyRate).
	ErrSlowBody = errors.New("httpapi: request body too slow")
	// ErrUnsupportedType reports an ingest body that is not declared JSON
	// or NDJSON.
	ErrUnsupportedType = errors.New("httpapi: unsupported Content-Type")
	// ErrForbiddenOrigin reports a write from a web page whose origin is not
	// in Options.AllowedOrigins.
	ErrForbiddenOrigin = errors.New("httpapi: cross-origin write refused")
)

// httpTable maps the errors of HTTP alone; the rest come from the table
// both APIs share (services.StatusOf).
var httpTable = []struct {
	err    error
	status int
}{
	{ErrSlowBody, http.StatusRequestTimeout},
	{ErrUnsupportedType, http.StatusUnsupportedMediaType},
	{ErrForbiddenOrigin, http.StatusForbidden},
}

// statusOf is the HTTP status of err: an oversized body is 413, then
// httpTable, then the shared table.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	for _, e := range httpTable {
		if errors.Is(err, e.err) {
			return e.status
		}
	}
	return services.StatusOf(err).HTTP
}
