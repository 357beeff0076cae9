package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
)

// blockingBackend holds every ingest until released.
type blockingBackend struct {
	Backend // the methods not defined below are never called
	entered chan struct{}
	release chan struct{}
}

func (b *blockingBackend) Ingest(ctx context.Context, _ string, events []json.RawMessage) (actors.Result, error) {
	b.entered <- struct{}{}
	<-b.release
	return actors.Result{Accepted: len(events)}, nil
}

func (b *blockingBackend) Query(context.Context, string, string) (any, error) { return nil, nil }
func (b *blockingBackend) Serving() bool                                      { return true }
func (b *blockingBackend) Delete(context.Context, string, string) error       { return nil }

// TestIngestConcurrencyBounded: with one slot, a second ingest waits, and
// gets 503 if its context ends before the slot frees.
func TestIngestConcurrencyBounded(t *testing.T) {
	b := &blockingBackend{entered: make(chan struct{}, 2), release: make(chan struct{})}
	h := New(b, Options{MaxConcurrentIngests: 1})

	first := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		h.ServeHTTP(first, jsonRequest(context.Background(), `[{}]`))
		close(done)
	}()
	<-b.entered // the first holds the only slot

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	second := httptest.NewRecorder()
	h.ServeHTTP(second, jsonRequest(ctx, `[{}]`))
	if second.Code != http.StatusTooManyRequests || second.Header().Get("Retry-After") == "" {
		t.Errorf("second ingest without a slot: %d (Retry-After %q), want 429 with Retry-After", second.Code, second.Header().Get("Retry-After"))
	}
	select {
	case <-b.entered:
		t.Error("the second ingest reached the backend")
	default:
	}
	close(b.release)
	<-done
	if first.Code != http.StatusOK {
		t.Errorf("first ingest: %d", first.Code)
	}
}

// jsonRequest is an ingest of body to pipeline p.
func jsonRequest(ctx context.Context, body string) *http.Request {
	r := httptest.NewRequestWithContext(ctx, "POST", "/v1/pipelines/p/events", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}
