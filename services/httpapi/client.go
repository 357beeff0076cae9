package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/keyfold/keyfold/actors"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// Client talks to a node's HTTP API.
type Client struct {
	// Base is the node's base URL, e.g. "http://127.0.0.1:8080".
	Base string
	// HTTP is the client to use; nil is http.DefaultClient.
	HTTP *http.Client
}

// StatusError is a non-2xx answer of the API.
type StatusError struct {
	Status  int
	Message string // the API's {"error": …}, or the body
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("http %d: %s", e.Status, e.Message)
}

// Retryable reports whether the same request may succeed later: the node
// was unavailable or the deadline passed. Retrying is safe for events with
// ids (they are applied once).
func (e *StatusError) Retryable() bool {
	return e.Status == http.StatusServiceUnavailable || e.Status == http.StatusGatewayTimeout
}

// Ingest posts a batch of events (each a JSON object) to a pipeline.
func (c *Client) Ingest(ctx context.Context, pipeline string, events []json.RawMessage) (accepted, duplicates int, err error) {
	var body bytes.Buffer
	body.Grow(len(events) * 128)
	body.WriteByte('[')
	for i, ev := range events {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(ev)
	}
	body.WriteByte(']')
	var res actors.Result
	if err := c.do(ctx, http.MethodPost, "/v1/pipelines/"+url.PathEscape(pipeline)+"/events", &body, &res); err != nil {
		return 0, 0, err
	}
	return res.Accepted, res.Duplicates, nil
}

// Query returns one key's state as the API's JSON.
func (c *Client) Query(ctx context.Context, pipeline, key string) (json.RawMessage, error) {
	var res json.RawMessage
	err := c.do(ctx, http.MethodGet, "/v1/pipelines/"+url.PathEscape(pipeline)+"/keys/"+url.PathEscape(key), nil, &res)
	return res, err
}

// Call posts a call to a key's Go handler and returns its reply (a JSON
// value) and whether it was kept from an earlier call with the same id.
// The handler's failure is a *StatusError with status 422 and its text.
func (c *Client) Call(ctx context.Context, pipeline, key string, req CallRequest) (reply json.RawMessage, duplicate bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, false, err
	}
	var res struct {
		Reply     json.RawMessage `json:"reply"`
		Duplicate bool            `json:"duplicate"`
	}
	err = c.do(ctx, http.MethodPost, "/v1/pipelines/"+url.PathEscape(pipeline)+"/keys/"+url.PathEscape(key)+"/call", bytes.NewReader(body), &res)
	return res.Reply, res.Duplicate, err
}

// Pipelines describes the node's pipelines, sorted by name (GET
// /v1/pipelines): the same messages as the gRPC client's Pipelines.
func (c *Client) Pipelines(ctx context.Context) ([]*keyfoldv1.PipelineInfo, error) {
	res, err := c.listPipelines(ctx)
	return res.GetPipelines(), err
}

// Joins describes the node's joins, sorted by name (GET /v1/pipelines'
// joins): the same messages as the gRPC client's Joins.
func (c *Client) Joins(ctx context.Context) ([]*keyfoldv1.JoinInfo, error) {
	res, err := c.listPipelines(ctx)
	return res.GetJoins(), err
}

func (c *Client) listPipelines(ctx context.Context) (*keyfoldv1.ListPipelinesResponse, error) {
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/v1/pipelines", nil, &raw); err != nil {
		return nil, err
	}
	var res keyfoldv1.ListPipelinesResponse
	// A newer node may describe more: fields this client does not know are
	// skipped, as a gRPC client skips them.
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("GET /v1/pipelines: %w", err)
	}
	return &res, nil
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.Base, "/")+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return &StatusError{Status: resp.StatusCode, Message: msg}
	}
	return json.Unmarshal(b, out)
}
