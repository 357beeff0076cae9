package cluster

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

// TestStateRoundTrip: a key's state encoded by its owner (StateResponse)
// reads back, on the member that asked, as the view the owner's host gave,
// the aggregates' values of the types a local query gives.
func TestStateRoundTrip(t *testing.T) {
	spec := fold.Spec{Aggregates: map[string]fold.AggregateSpec{
		"n": {Op: "count"}, "sum": {Op: "sum"}, "last": {Op: "last"}, "amounts": {Op: "quantiles"}, "none": {Op: "max"},
	}}
	start := time.UnixMilli(1_700_000_000_000).UTC()
	since := start.Add(time.Second)
	for _, c := range []struct {
		name  string
		timed bool
		kv    actors.KeyView
		time  string // time_json
	}{
		{"untimed", false, actors.KeyView{Seq: 3, Duplicates: 1, Aggregates: map[string]any{
			"n": uint64(3), "sum": 4.5, "last": json.RawMessage(`{"a":[1,"x"]}`),
			"amounts": map[string]any{"p50": 1.5, "p90": 2.0, "p99": 2.0}, "none": nil,
		}}, ""},
		{"timed, no watermark yet", true, actors.KeyView{Seq: 1, Aggregates: map[string]any{"n": uint64(1)}},
			`{"late":0,"windows":[]}`},
		{"timed", true, actors.KeyView{Seq: 2, Aggregates: map[string]any{"n": uint64(2)},
			Watermark: start.UnixMilli(), Late: 4, LateWindows: map[string]uint64{"w": 4},
			Windows:  []fold.WindowView{{Name: "w", Kind: "tumbling", Start: start, End: start.Add(time.Minute), Count: 2, Values: map[string]any{"n": 2.0}}},
			Patterns: []fold.PatternView{{Name: "p", Kind: "threshold", Matches: 1, Count: 2, Since: &since}}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, err := StateResponse("p", "k", c.kv, c.timed)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Pipeline != "p" || resp.Key != "k" || (len(resp.TimeJson) > 0) != c.timed {
				t.Fatalf("response %v", resp)
			}
			if c.time != "" && string(resp.TimeJson) != c.time {
				t.Errorf("time_json %s, want %s", resp.TimeJson, c.time)
			}
			got, err := decodeState(resp, spec)
			if err != nil {
				t.Fatal(err)
			}
			want := c.kv
			if c.timed && want.Windows == nil {
				want.Windows = []fold.WindowView{}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("read back %+v, want %+v", got, want)
			}
		})
	}
}
