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

// TimeState is a key's event-time state as the gRPC API encodes it
// (GetStateResponse.time_json): the owner encodes it, a member that asked
// decodes it.
type TimeState struct {
	Watermark *time.Time         `json:"watermark,omitempty"`
	Late      *uint64            `json:"late"`
	Windows   []fold.WindowView  `json:"windows"`
	Patterns  []fold.PatternView `json:"patterns,omitempty"`
	// LateWindows counts, per window name, the events too late for at
	// least one window of that name.
	LateWindows map[string]uint64 `json:"late_windows,omitempty"`
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
		var t TimeState
		if err := json.Unmarshal(resp.TimeJson, &t); err != nil {
			return actors.KeyView{}, fmt.Errorf("keyfold: owner's windows: %w", err)
		}
		if t.Watermark != nil {
			kv.Watermark = t.Watermark.UnixMilli()
		}
		if t.Late != nil {
			kv.Late = *t.Late
		}
		kv.Windows, kv.Patterns, kv.LateWindows = t.Windows, t.Patterns, t.LateWindows
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
