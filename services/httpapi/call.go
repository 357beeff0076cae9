package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/keyfold/keyfold/actors/fold"
)

// CallRequest is the body of POST /v1/pipelines/{p}/keys/{key}/call: the
// request to the key's handler (any JSON value; absent is null), its id
// for exactly-once, and whether it is read-only (not logged; it takes no
// id).
type CallRequest struct {
	Request  json.RawMessage `json:"request"`
	ID       string          `json:"id,omitempty"`
	ReadOnly bool            `json:"read_only,omitempty"`
}

// callEnvelope bounds the part of a call's body beyond its request (the
// id, the flag, the field names and space).
const callEnvelope = fold.MaxCallIDBytes + 4<<10

// call: a JSON body of at most the largest request and its envelope,
// decoded strictly (an unknown field is a mistake: "readOnly" for
// "read_only" would log a call meant to change nothing), then a slot.
func (s *server) call(w http.ResponseWriter, r *http.Request) {
	if ndjson, err := bodyType(r.Header.Get("Content-Type")); err != nil || ndjson {
		if err == nil {
			err = fmt.Errorf("%w: a call's body is one JSON object: send %s", ErrUnsupportedType, typeJSON)
		}
		s.fail(w, r, err)
		return
	}
	body, reserved, err := s.readBodyUpTo(w, r, min(s.opts.MaxBodyBytes, fold.MaxRequestBytes+callEnvelope))
	defer func() { s.opts.Budget.Release(reserved) }()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req, err := decodeCall(body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.acquire(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	defer s.release()
	res, err := s.b.Call(r.Context(), r.PathValue("pipeline"), r.PathValue("key"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// decodeCall decodes a call's body: one JSON object with the fields of
// CallRequest and no others.
func decodeCall(body []byte) (CallRequest, error) {
	var req CallRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return CallRequest{}, fmt.Errorf("%w: want {\"request\": …, \"id\": …, \"read_only\": …}: %v", ErrBadBody, err)
	}
	if dec.More() {
		return CallRequest{}, fmt.Errorf("%w: want one JSON object, found more after it", ErrBadBody)
	}
	if req.Request == nil {
		req.Request = json.RawMessage("null")
	}
	return req, nil
}
