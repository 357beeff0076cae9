package services

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

var (
	// ErrBadRequest wraps every error decoding a request (a body, a
	// message) before its events are looked at.
	ErrBadRequest = errors.New("bad request")
	// ErrBusy reports a request refused because the node is at its limit
	// of concurrent work; retry later.
	ErrBusy = actors.ErrBusy
	// ErrOverBudget reports an ingest refused because the node's budget of
	// ingest bytes in flight (max_ingest_bytes) is used up; retry later.
	ErrOverBudget = errors.New("services: ingest memory budget in use")
	// ErrTooManyEvents reports a batch of more than max_batch_events
	// events; it must be split.
	ErrTooManyEvents = errors.New("services: too many events in one batch")
)

// Status is how the transports report an error: its HTTP status and its
// gRPC code.
type Status struct {
	HTTP int
	GRPC codes.Code
}

// StatusClientClosed is the HTTP status of a request whose client went
// away (nginx's convention).
const StatusClientClosed = 499

// statusTable is the one mapping from domain errors to transport statuses,
// first match wins; both APIs use it, so the same failure gets the
// matching status on each.
var statusTable = []struct {
	err error
	Status
}{
	{ErrBadRequest, Status{http.StatusBadRequest, codes.InvalidArgument}},
	{actors.ErrBadArgument, Status{http.StatusBadRequest, codes.InvalidArgument}},
	{fold.ErrInvalidEvent, Status{http.StatusBadRequest, codes.InvalidArgument}},
	{fold.ErrInvalidCall, Status{http.StatusBadRequest, codes.InvalidArgument}},
	{fold.ErrCallTooLarge, Status{http.StatusRequestEntityTooLarge, codes.InvalidArgument}},
	// The handler refused the call (a business rule): nothing changed, and
	// sending it again unchanged gets the same answer.
	{fold.ErrCallFailed, Status{http.StatusUnprocessableEntity, codes.FailedPrecondition}},
	{fold.ErrNoCallHandler, Status{http.StatusNotFound, codes.Unimplemented}},
	{ErrBusy, Status{http.StatusTooManyRequests, codes.ResourceExhausted}},
	{ErrOverBudget, Status{http.StatusTooManyRequests, codes.ResourceExhausted}},
	// Not ResourceExhausted: that code is retryable, and this batch never
	// fits however long the client waits.
	{ErrTooManyEvents, Status{http.StatusRequestEntityTooLarge, codes.InvalidArgument}},
	{actors.ErrUnknownPipeline, Status{http.StatusNotFound, codes.NotFound}},
	{actors.ErrNotFound, Status{http.StatusNotFound, codes.NotFound}},
	{actors.ErrClosed, Status{http.StatusServiceUnavailable, codes.Unavailable}},
	{actors.ErrUnavailable, Status{http.StatusServiceUnavailable, codes.Unavailable}},
	{actors.ErrFailed, Status{http.StatusServiceUnavailable, codes.Unavailable}},
	{actors.ErrNotReady, Status{http.StatusServiceUnavailable, codes.Unavailable}},
	{context.DeadlineExceeded, Status{http.StatusGatewayTimeout, codes.DeadlineExceeded}},
	{context.Canceled, Status{StatusClientClosed, codes.Canceled}},
}

// StatusOf returns the statuses of err; an error the table does not know
// is internal (500, Internal).
func StatusOf(err error) Status {
	for _, e := range statusTable {
		if errors.Is(err, e.err) {
			return e.Status
		}
	}
	return Status{http.StatusInternalServerError, codes.Internal}
}

// Retryable reports whether a request that failed with this status may
// succeed if sent again later, unchanged.
func (s Status) Retryable() bool {
	switch s.GRPC {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// PublicMessage is an error's text for clients: without the leading Go
// package names ("actors: key not found" → "key not found").
func PublicMessage(err error) string {
	msg := err.Error()
	for {
		i := strings.Index(msg, ": ")
		if i < 0 || !goPackages[msg[:i]] {
			return msg
		}
		msg = msg[i+2:]
	}
}

var goPackages = map[string]bool{
	"actors": true, "fold": true, "httpapi": true, "grpcapi": true, "keyfold": true,
	"persistence": true, "embedded": true, "redisstore": true, "memstore": true,
	"services": true,
}
