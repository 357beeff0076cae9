package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/keyfold/keyfold/actors"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services"
)

// Timeouts servers of this API should use: a client that trickles its
// request must not hold a goroutine and a body buffer forever. An ingest
// sets its own, shorter deadline for its body (see Options.MinBodyRate).
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 2 * time.Minute // a whole request, body included
	IdleTimeout       = 2 * time.Minute // between requests on a kept-alive connection
)

// Defaults of Options.
const (
	DefaultMinBodyRate = 128 << 10 // bytes/s
	DefaultBodyGrace   = 10 * time.Second
	DefaultSlotWait    = time.Second
)

// Backend is what the API serves; the keyfold package adapts its Node to it.
type Backend interface {
	// Ingest validates, logs and applies a batch of events of one pipeline.
	Ingest(ctx context.Context, pipeline string, events []json.RawMessage) (actors.Result, error)
	// Query returns one key's state, encoded as JSON as it is.
	Query(ctx context.Context, pipeline, key string) (any, error)
	// Delete erases one key.
	Delete(ctx context.Context, pipeline, key string) error
	// Call calls one key's Go handler; it returns the answer to encode as
	// JSON.
	Call(ctx context.Context, pipeline, key string, req CallRequest) (any, error)
	// Outputs returns up to limit outputs of a pipeline stored after cursor
	// after ("" from the oldest kept).
	Outputs(ctx context.Context, pipeline, after string, limit int) ([]Output, error)
	// Subscribe calls fn with each output stored after cursor after, then
	// with new ones as they are stored, until ctx ends or fn fails.
	Subscribe(ctx context.Context, pipeline, after string, fn func(Output) error) error
	// Serving reports whether the node is ready and not draining.
	Serving() bool
	// Cluster describes the cluster and, if key is set, the owner of
	// pipeline's key.
	Cluster(ctx context.Context, pipeline, key string) (any, error)
	// Pipelines and Joins describe the configured pipelines and joins,
	// sorted by name: the messages gRPC's ListPipelines returns, served as
	// their JSON.
	Pipelines() []*keyfoldv1.PipelineInfo
	Joins() []*keyfoldv1.JoinInfo
}

// Output is one output: its cursor and its JSON form.
type Output struct {
	Cursor string
	Value  any
}

// Options configures the handler.
type Options struct {
	// MaxBodyBytes bounds request bodies; larger ones get 413.
	MaxBodyBytes int64
	// MaxConcurrentIngests bounds the ingest requests processed at once
	// (default 64). A request takes its slot once its body is read, so
	// clients slow to send do not hold one; it waits for a slot for at
	// most SlotWait (or until its context ends), then gets 429.
	MaxConcurrentIngests int
	// SlotWait bounds the wait for an ingest slot (default 1s).
	SlotWait time.Duration
	// MaxBatchEvents bounds the events of one request (default
	// services.DefaultMaxBatchEvents); more get 413.
	MaxBatchEvents int
	// Budget bounds the memory of the ingests in flight (their bodies as
	// they are read, and services.EventCost per event); a request that does
	// not fit gets 429. The node shares one with the gRPC API; nil makes
	// one of services.DefaultMaxIngestBytes for this handler.
	Budget *services.Budget
	// MinBodyRate (bytes/s, default 128 KiB/s) and BodyGrace (default 10s)
	// bound the time to read an ingest body: BodyGrace plus its length
	// (Content-Length, else MaxBodyBytes) at MinBodyRate. A client slower
	// than that gets 408 and its connection is closed; however slowly it
	// sends, it holds no ingest slot and only the buffer it filled.
	MinBodyRate int64
	BodyGrace   time.Duration
	// AllowedOrigins are the origins (scheme://host[:port], or "*" for any)
	// whose web pages may write: a POST or DELETE carrying an Origin
	// header not listed is refused with 403. Browsers send Origin with
	// cross-site requests, so a page on another site cannot write to the
	// node (even one on localhost); clients that are not browsers send
	// none and are not affected.
	AllowedOrigins []string
	// Logger receives request failures (5xx); nil discards.
	Logger *slog.Logger
}

type server struct {
	b     Backend
	opts  Options
	slots chan struct{} // ingest concurrency
}

// New returns the API's handler over b.
func New(b Backend, opts Options) http.Handler {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 8 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConcurrentIngests <= 0 {
		opts.MaxConcurrentIngests = 64
	}
	if opts.SlotWait <= 0 {
		opts.SlotWait = DefaultSlotWait
	}
	if opts.MaxBatchEvents <= 0 {
		opts.MaxBatchEvents = services.DefaultMaxBatchEvents
	}
	if opts.Budget == nil {
		opts.Budget = services.NewBudget(services.DefaultMaxIngestBytes)
	}
	if opts.MinBodyRate <= 0 {
		opts.MinBodyRate = DefaultMinBodyRate
	}
	if opts.BodyGrace <= 0 {
		opts.BodyGrace = DefaultBodyGrace
	}
	s := &server{b: b, opts: opts, slots: make(chan struct{}, opts.MaxConcurrentIngests)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/pipelines", s.pipelines)
	mux.HandleFunc("POST /v1/pipelines/{pipeline}/events", s.writes(s.ingest))
	mux.HandleFunc("GET /v1/pipelines/{pipeline}/keys/{key}", s.query)
	mux.HandleFunc("DELETE /v1/pipelines/{pipeline}/keys/{key}", s.writes(s.delete))
	mux.HandleFunc("POST /v1/pipelines/{pipeline}/keys/{key}/call", s.writes(s.call))
	mux.HandleFunc("GET /v1/pipelines/{pipeline}/outputs", s.outputs)
	mux.HandleFunc("GET /v1/pipelines/{pipeline}/outputs/stream", s.stream)
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		info, err := b.Cluster(r.Context(), q.Get("pipeline"), q.Get("key"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !b.Serving() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return jsonErrors{mux}
}

// jsonErrors answers requests no route takes (404, or 405 with its Allow
// header) in the API's JSON error shape instead of the mux's plain text.
type jsonErrors struct{ mux *http.ServeMux }

func (j jsonErrors) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := j.mux.Handler(r)
	if pattern != "" {
		j.mux.ServeHTTP(w, r)
		return
	}
	c := &statusCapture{header: http.Header{}}
	h.ServeHTTP(c, r)
	if c.status == 0 {
		c.status = http.StatusNotFound
	}
	if allow := c.header.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	msg := fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)
	if c.status == http.StatusMethodNotAllowed {
		msg = fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)
	}
	writeJSON(w, c.status, map[string]string{"error": msg})
}

// statusCapture records the status a handler answers, dropping its body.
type statusCapture struct {
	header http.Header
	status int
}

func (c *statusCapture) Header() http.Header         { return c.header }
func (c *statusCapture) Write(b []byte) (int, error) { return len(b), nil }
func (c *statusCapture) WriteHeader(status int)      { c.status = status }

// writes guards a route that changes state: a request from a web page of
// an origin not allowed is refused before anything is read.
func (s *server) writes(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if origin := r.Header.Get("Origin"); origin != "" && !s.originAllowed(origin) {
			s.fail(w, r, fmt.Errorf("%w: origin %q may not write to this node (allowed_origins: %s)", ErrForbiddenOrigin, origin, s.allowedList()))
			return
		}
		h(w, r)
	}
}

func (s *server) originAllowed(origin string) bool {
	for _, o := range s.opts.AllowedOrigins {
		if o == "*" || strings.EqualFold(o, origin) {
			return true
		}
	}
	return false
}

func (s *server) allowedList() string {
	if len(s.opts.AllowedOrigins) == 0 {
		return "none"
	}
	return strings.Join(s.opts.AllowedOrigins, ", ")
}

// Media types an ingest body may have.
const (
	typeJSON   = "application/json"
	typeNDJSON = "application/x-ndjson"
)

// bodyType returns whether an ingest body of Content-Type ct is NDJSON, or
// an error wrapping ErrUnsupportedType: only JSON and NDJSON are taken,
// and a type is required. (A web page can send text/plain, form data or no
// type at all to any origin without a CORS preflight; JSON needs one.)
func bodyType(ct string) (ndjson bool, err error) {
	mt, _, perr := mime.ParseMediaType(ct)
	switch {
	case perr == nil && mt == typeJSON:
		return false, nil
	case perr == nil && (mt == typeNDJSON || mt == "application/jsonl" || mt == "application/ndjson"):
		return true, nil
	case ct == "":
		return false, fmt.Errorf("%w: no Content-Type: send %s (a JSON array of events, or one object) or %s (NDJSON)", ErrUnsupportedType, typeJSON, typeNDJSON)
	}
	return false, fmt.Errorf("%w: Content-Type %q: send %s (a JSON array of events, or one object) or %s (NDJSON)", ErrUnsupportedType, ct, typeJSON, typeNDJSON)
}

// ingest: check the type, read the body within its budget and deadline,
// split it, reserve its events' cost, then take a slot and hand it on. The
// slot is taken last, so it is held only while the backend works.
func (s *server) ingest(w http.ResponseWriter, r *http.Request) {
	ndjson, err := bodyType(r.Header.Get("Content-Type"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body, reserved, err := s.readBody(w, r)
	defer func() { s.opts.Budget.Release(reserved) }()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var events []json.RawMessage
	if ndjson {
		events, err = decodeNDJSON(body, s.opts.MaxBatchEvents)
	} else {
		events, err = decodeJSON(body, s.opts.MaxBatchEvents)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	cost := int64(len(events)) * services.EventCost
	if err := s.opts.Budget.Reserve(cost); err != nil {
		s.fail(w, r, err)
		return
	}
	reserved += cost
	if err := s.acquire(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.release()
	res, err := s.b.Ingest(r.Context(), r.PathValue("pipeline"), events)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// acquire takes an ingest slot (calls take them too), waiting at most
// SlotWait; release gives it back.
func (s *server) acquire(ctx context.Context) error {
	wait := time.NewTimer(s.opts.SlotWait)
	defer wait.Stop()
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-wait.C:
		return fmt.Errorf("%w: %d ingests in progress (max_concurrent_ingests)", ErrBusy, s.opts.MaxConcurrentIngests)
	case <-ctx.Done():
		return ErrBusy
	}
}

func (s *server) release() { <-s.slots }

// firstBodyBuffer is the buffer a body is first read into; it grows (each
// growth reserved in the budget) as the body arrives, so a client that
// announces a large body and sends it slowly holds little.
const firstBodyBuffer = 64 << 10

// readBody reads the request body, at most MaxBodyBytes, before a deadline
// that follows its announced length (BodyGrace + length at MinBodyRate),
// reserving its buffer in the budget as it grows. It returns the bytes
// reserved, to release once the request is done, also on error.
func (s *server) readBody(w http.ResponseWriter, r *http.Request) (body []byte, reserved int64, err error) {
	return s.readBodyUpTo(w, r, s.opts.MaxBodyBytes)
}

// readBodyUpTo is readBody with a limit of its own (below MaxBodyBytes).
func (s *server) readBodyUpTo(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, reserved int64, err error) {
	if r.ContentLength > limit {
		return nil, 0, &http.MaxBytesError{Limit: limit}
	}
	expect := r.ContentLength
	if expect < 0 {
		expect = limit
	}
	rc := http.NewResponseController(w)
	allowed := s.opts.BodyGrace + time.Duration(float64(expect)/float64(s.opts.MinBodyRate)*float64(time.Second))
	deadline := time.Now().Add(allowed)
	if err := rc.SetReadDeadline(deadline); err == nil {
		// Once read, no deadline: the server's would end the request's
		// context while the backend works.
		defer rc.SetReadDeadline(time.Time{})
	}
	in := http.MaxBytesReader(w, r.Body, limit)
	size := min(expect+1, firstBodyBuffer) // +1: room to see the end
	if err := s.opts.Budget.Reserve(size); err != nil {
		return nil, 0, err
	}
	reserved = size
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			grown := min(2*int64(cap(buf)), limit+1)
			if r.ContentLength >= 0 {
				grown = min(grown, r.ContentLength+1)
			}
			if grown <= int64(cap(buf)) {
				grown = int64(cap(buf)) + 1 // a body longer than announced: MaxBytesReader or the transport stops it
			}
			if err := s.opts.Budget.Reserve(grown - int64(cap(buf))); err != nil {
				return nil, reserved, err
			}
			reserved += grown - int64(cap(buf))
			next := make([]byte, len(buf), grown)
			copy(next, buf)
			buf = next
		}
		n, err := in.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			return buf, reserved, nil
		case err != nil:
			var mbe *http.MaxBytesError
			var ne net.Error
			switch {
			case errors.As(err, &mbe):
			case errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded):
				err = fmt.Errorf("%w: %d of %d bytes in %v: send at least %d bytes/s", ErrSlowBody, len(buf), expect, allowed.Round(time.Millisecond), s.opts.MinBodyRate)
			default:
				err = fmt.Errorf("%w: reading the body: %v", ErrBadBody, err)
			}
			return nil, reserved, err
		}
	}
}

func (s *server) query(w http.ResponseWriter, r *http.Request) {
	st, err := s.b.Query(r.Context(), r.PathValue("pipeline"), r.PathValue("key"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// pipelinesJSON is how GET /v1/pipelines writes its answer: the JSON of
// gRPC's ListPipelinesResponse, with the .proto's field names (snake_case,
// as the rest of the API), so both transports describe a pipeline in one
// shape. Durations are strings ("86400s"); unset fields are left out.
var pipelinesJSON = protojson.MarshalOptions{UseProtoNames: true}

func (s *server) pipelines(w http.ResponseWriter, r *http.Request) {
	b, err := pipelinesJSON.Marshal(&keyfoldv1.ListPipelinesResponse{Pipelines: s.b.Pipelines(), Joins: s.b.Joins()})
	if err != nil {
		s.fail(w, r, fmt.Errorf("encoding the pipelines: %w", err))
		return
	}
	// protojson varies its spacing on purpose; RawMessage is compacted
	// when encoded, so the answer is byte for byte the same every time.
	writeJSON(w, http.StatusOK, json.RawMessage(b))
}

func (s *server) delete(w http.ResponseWriter, r *http.Request) {
	if err := s.b.Delete(r.Context(), r.PathValue("pipeline"), r.PathValue("key")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	msg := services.PublicMessage(err)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		msg = fmt.Sprintf("request body exceeds the limit of %d bytes", mbe.Limit)
	}
	if status == http.StatusRequestTimeout {
		w.Header().Set("Connection", "close") // the rest of its body is not read
	}
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		// Both are temporary: a key group being taken over, a store that
		// is down, a full node, a drain.
		w.Header().Set("Retry-After", "1")
	}
	if status >= 500 {
		s.opts.Logger.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// DecodeJSON splits a batch: a JSON array of events, or a single event
// object. Each event is returned as its raw bytes (aliasing body). Splitting
// only finds the elements' boundaries; each element is validated when the
// pipeline decodes it (an invalid one rejects the batch there), so the body
// is parsed once, not twice.
func DecodeJSON(body []byte) ([]json.RawMessage, error) { return decodeJSON(body, 0) }

// decodeJSON is DecodeJSON that stops, with an error wrapping
// services.ErrTooManyEvents, at more than max events (0: no limit).
func decodeJSON(body []byte, max int) ([]json.RawMessage, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, fmt.Errorf("%w: empty body: want a JSON array of events", ErrBadBody)
	}
	if trimmed[0] == '{' {
		if bytes.IndexByte(trimmed, '\n') >= 0 && !json.Valid(trimmed) {
			return nil, fmt.Errorf("%w: several JSON objects: send NDJSON with Content-Type: application/x-ndjson, or a JSON array", ErrBadBody)
		}
		return []json.RawMessage{trimmed}, nil
	}
	if trimmed[0] != '[' {
		return nil, fmt.Errorf("%w: want a JSON array of events (or NDJSON with Content-Type: application/x-ndjson)", ErrBadBody)
	}
	return splitArray(trimmed, max)
}

// splitArray returns the elements of a JSON array b (which starts with '['
// and has no surrounding space) without decoding them.
func splitArray(b []byte, max int) ([]json.RawMessage, error) {
	var events []json.RawMessage
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == ']' {
		if i+1 != len(b) {
			return nil, fmt.Errorf("%w: unexpected data after the array at byte %d", ErrBadBody, i+1)
		}
		return events, nil
	}
	for {
		end, err := skipValue(b, i)
		if err != nil {
			return nil, fmt.Errorf("%w: event %d: %v", ErrBadBody, len(events), err)
		}
		if max > 0 && len(events) == max {
			return nil, services.BatchTooLarge(max+1, max)
		}
		events = append(events, json.RawMessage(b[i:end]))
		i = skipSpace(b, end)
		if i >= len(b) {
			return nil, fmt.Errorf("%w: unterminated array", ErrBadBody)
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			if i+1 != len(b) {
				return nil, fmt.Errorf("%w: unexpected data after the array at byte %d", ErrBadBody, i+1)
			}
			return events, nil
		default:
			return nil, fmt.Errorf("%w: want ',' or ']' after event %d at byte %d, got %q", ErrBadBody, len(events)-1, i, b[i])
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i]: it matches
// brackets and strings, and leaves full validation to the decoder.
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errors.New("unexpected end of input")
	}
	switch b[i] {
	case ',', ']', '}', ':':
		return 0, fmt.Errorf("unexpected %q at byte %d", b[i], i)
	case '{', '[':
	case '"':
		return skipString(b, i)
	default: // number, true, false, null (or garbage the decoder rejects)
		j := i
		for j < len(b) && b[j] != ',' && b[j] != ']' && b[j] != '}' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
			j++
		}
		return j, nil
	}
	depth := 0
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '"':
			end, err := skipString(b, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, errors.New("unexpected end of input")
}

// skipString returns the end of the string starting at b[i] == '"'.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, errors.New("unterminated string")
}

// DecodeNDJSON splits a batch of newline-delimited JSON events; blank lines
// are skipped. Events alias body.
func DecodeNDJSON(body []byte) ([]json.RawMessage, error) { return decodeNDJSON(body, 0) }

// decodeNDJSON is DecodeNDJSON that stops, with an error wrapping
// services.ErrTooManyEvents, at more than max events (0: no limit).
func decodeNDJSON(body []byte, max int) ([]json.RawMessage, error) {
	lines := bytes.Count(body, []byte{'\n'}) + 1 // at most this many events
	if max > 0 {
		lines = min(lines, max)
	}
	events := make([]json.RawMessage, 0, lines)
	for line := 1; len(body) > 0; line++ {
		var b []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			b, body = body[:i], body[i+1:]
		} else {
			b, body = body, nil
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			continue
		}
		if max > 0 && len(events) == max {
			return nil, services.BatchTooLarge(max+1, max)
		}
		if !json.Valid(b) {
			return nil, fmt.Errorf("%w: line %d: invalid JSON", ErrBadBody, line)
		}
		events = append(events, json.RawMessage(b))
	}
	return events, nil
}
