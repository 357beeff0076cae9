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

// statusOf is the HTTP status of err, from the table both APIs share
// (services.StatusOf); an oversized body is 413.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge
	}
	return services.StatusOf(err).HTTP
}
