package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// A key's state travels as a GetStateResponse (the public gRPC API's
// GetState and the node-to-node service's): the host's view of the key
// (actors.KeyView) is encoded once, by StateResponse, and read back into
// the same view by decodeState, here, on the member that asked its owner.

// timeState is a key's event-time state as GetStateResponse.time_json
// holds it.
type timeState struct {
	Watermark *time.Time         `json:"watermark,omitempty"`
	Late      *uint64            `json:"late"`
	Windows   []fold.WindowView  `json:"windows"`
	Patterns  []fold.PatternView `json:"patterns,omitempty"`
	// LateWindows counts, per window name, the events too late for at
	// least one window of that name.
	LateWindows map[string]uint64 `json:"late_windows,omitempty"`
	// Of a join's key: its buffered events per side and its results.
	Join *fold.JoinView `json:"join,omitempty"`
}

// StateResponse encodes a key's state; timed says its pipeline has windows,
// patterns or a Go handler (then time_json is set). Each aggregate is the
// JSON of its value; a Go handler's state is state_json.
func StateResponse(pipeline, key string, kv actors.KeyView, timed bool) (*keyfoldv1.GetStateResponse, error) {
	resp := &keyfoldv1.GetStateResponse{Pipeline: pipeline, Key: key, Seq: kv.Seq, Duplicates: kv.Duplicates,
		Aggregates: make(map[string][]byte, len(kv.Aggregates)), StateJson: kv.State, HandlerFailures: kv.HandlerFailures}
	for name, v := range kv.Aggregates {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode aggregate %q: %w", name, err)
		}
		resp.Aggregates[name] = b
	}
	if timed {
		t := timeState{Late: &kv.Late, Windows: kv.Windows, Patterns: kv.Patterns, LateWindows: kv.LateWindows, Join: kv.Join}
		if kv.Watermark > 0 { // none yet: absent
			wm := time.UnixMilli(kv.Watermark).UTC()
			t.Watermark = &wm
		}
		if t.Windows == nil {
			t.Windows = []fold.WindowView{}
		}
		var err error
		if resp.TimeJson, err = json.Marshal(t); err != nil {
			return nil, fmt.Errorf("encode the key's windows: %w", err)
		}
	}
	return resp, nil
}

// decodeState is the owner's answer as the host's view of the key, with
// the aggregates' values of the types a local query gives (spec names
// their ops).
func decodeState(resp *keyfoldv1.GetStateResponse, spec fold.Spec) (actors.KeyView, error) {
	kv := actors.KeyView{Seq: resp.Seq, Duplicates: resp.Duplicates, Aggregates: make(map[string]any, len(resp.Aggregates))}
	for name, b := range resp.Aggregates {
		v, err := aggregateValue(spec.Aggregates[name].Op, b)
		if err != nil {
			return actors.KeyView{}, fmt.Errorf("keyfold: owner's aggregate %q: %w", name, err)
		}
		kv.Aggregates[name] = v
	}
	if len(resp.TimeJson) > 0 {
		var t timeState
		if err := json.Unmarshal(resp.TimeJson, &t); err != nil {
			return actors.KeyView{}, fmt.Errorf("keyfold: owner's windows: %w", err)
		}
		if t.Watermark != nil {
			kv.Watermark = t.Watermark.UnixMilli()
		}
		if t.Late != nil {
			kv.Late = *t.Late
		}
		kv.Windows, kv.Patterns, kv.LateWindows, kv.Join = t.Windows, t.Patterns, t.LateWindows, t.Join
	}
	if len(resp.StateJson) > 0 { // a Go handler's
		kv.State = json.RawMessage(slices.Clone(resp.StateJson))
	}
	kv.HandlerFailures = resp.HandlerFailures
	return kv, nil
}

// aggregateValue decodes an aggregate's JSON value to the type the fold
// gives it: counts uint64, last the raw JSON, numbers float64.
func aggregateValue(op string, b []byte) (any, error) {
	if string(b) == "null" {
		return nil, nil
	}
	switch op {
	case "count", "distinct":
		var u uint64
		err := json.Unmarshal(b, &u)
		return u, err
	case "last":
		if !json.Valid(b) {
			return nil, errors.New("invalid JSON")
		}
		return json.RawMessage(slices.Clone(b)), nil
	}
	var v any
	err := json.Unmarshal(b, &v)
	return v, err
}
