package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/keyfold/keyfold/services"
)

// Outputs over HTTP: a cursor-paged read, and a Server-Sent Events stream.

// Page sizes of GET …/outputs.
const (
	DefaultOutputsLimit = 100
	MaxOutputsLimit     = 10_000
)

type outputsResponse struct {
	Outputs []any `json:"outputs"`
	// Next is the cursor to pass as after for the following page: the last
	// output's, or the request's own when there was nothing newer.
	Next string `json:"next"`
}

// outputs answers GET /v1/pipelines/{pipeline}/outputs?after=C&limit=N.
func (s *server) outputs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultOutputsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxOutputsLimit {
			s.fail(w, r, fmt.Errorf("%w: limit must be an integer between 1 and %d, got %q", ErrBadBody, MaxOutputsLimit, v))
			return
		}
		limit = n
	}
	after := q.Get("after")
	outs, err := s.b.Outputs(r.Context(), r.PathValue("pipeline"), after, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	resp := outputsResponse{Outputs: make([]any, len(outs)), Next: after}
	for i, o := range outs {
		resp.Outputs[i] = o.Value
		resp.Next = o.Cursor
	}
	writeJSON(w, http.StatusOK, resp)
}

// sseHeartbeat is how often an idle stream sends a comment, so proxies and
// clients see that it is alive.
const sseHeartbeat = 15 * time.Second

// stream answers GET /v1/pipelines/{pipeline}/outputs/stream with Server-Sent
// Events: each output is an event "output" whose id is its cursor, so a
// client that reconnects with Last-Event-ID resumes after the last one it
// got (?after=C does the same for the first connection). Errors before the
// stream starts get the usual JSON error; one after ends the stream with an
// event "error".
func (s *server) stream(w http.ResponseWriter, r *http.Request) {
	after := r.Header.Get("Last-Event-ID")
	if after == "" {
		after = r.URL.Query().Get("after")
	}
	// Check the pipeline and the cursor before answering 200.
	if _, err := s.b.Outputs(r.Context(), r.PathValue("pipeline"), after, 1); err != nil {
		s.fail(w, r, err)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.fail(w, r, fmt.Errorf("streaming is not supported by this server"))
		return
	}
	// A stream outlives the server's write timeout.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": keyfold outputs\n\n")
	flusher.Flush()

	ctx := r.Context()
	events := make(chan Output)
	errc := make(chan error, 1)
	go func() {
		errc <- s.b.Subscribe(ctx, r.PathValue("pipeline"), after, func(o Output) error {
			select {
			case events <- o:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	beat := time.NewTicker(sseHeartbeat)
	defer beat.Stop()
	for {
		select {
		case o := <-events:
			data, err := json.Marshal(o.Value)
			if err != nil {
				return
			}
			fmt.Fprintf(w, "id: %s\nevent: output\ndata: %s\n\n", o.Cursor, data)
			flusher.Flush()
		case <-beat.C:
			fmt.Fprint(w, ": heartbeat\n\n")
			flusher.Flush()
		case err := <-errc:
			if err != nil && ctx.Err() == nil {
				s.opts.Logger.Warn("output stream ended", "path", r.URL.Path, "err", err)
				data, _ := json.Marshal(map[string]string{"error": services.PublicMessage(err)})
				fmt.Fprintf(w, "event: error\ndata: %s\n\n", data)
				flusher.Flush()
			}
			return
		}
	}
}
