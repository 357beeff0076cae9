package keyfold

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/keyfold/keyfold/actors/fold"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
)

// describePipelines describes the node's pipelines, sorted by name, as both
// transports answer them: gRPC's ListPipelines returns these messages and
// HTTP's GET /v1/pipelines their JSON, so the two cannot drift apart.
func (n *Node) describePipelines() []*keyfoldv1.PipelineInfo {
	out := make([]*keyfoldv1.PipelineInfo, 0, len(n.cfg.Pipelines))
	for _, name := range slices.Sorted(maps.Keys(n.cfg.Pipelines)) {
		out = append(out, describePipeline(name, n.cfg.Pipelines[name], n.pipelines[name]))
	}
	return out
}

// describePipeline describes one pipeline: its configuration spec with
// the defaults its compiled form p applies filled in. Settings that do
// not apply stay unset (see keyfoldv1.PipelineInfo).
func describePipeline(name string, spec PipelineConfig, p *fold.Pipeline) *keyfoldv1.PipelineInfo {
	info := &keyfoldv1.PipelineInfo{Name: name, KeyField: spec.Key, IdField: spec.ID, TimeField: spec.Time, Handler: p.HasHandler()}
	if spec.ID != "" {
		info.DedupWindow = durationpb.New(p.DedupWindow())
	}
	if ttl := p.TTL(); ttl > 0 {
		info.Ttl = durationpb.New(ttl)
	}
	aggregates := slices.Sorted(maps.Keys(spec.Aggregates)) // the order the pipeline computes them in
	for _, an := range aggregates {
		a := spec.Aggregates[an]
		info.Aggregates = append(info.Aggregates, &keyfoldv1.AggregateInfo{Name: an, Op: a.Op, Field: a.Field, Where: a.Where})
	}
	if p.Timed() {
		info.OutOfOrderness = durationpb.New(spec.OutOfOrderness)
		info.AllowedLateness = durationpb.New(spec.AllowedLateness)
		info.IdleTimeout = durationpb.New(cmp.Or(spec.IdleTimeout, fold.DefaultIdleTimeout))
		info.OutputRetention = durationpb.New(p.OutputRetention())
	}
	for _, wn := range slices.Sorted(maps.Keys(spec.Windows)) {
		w := spec.Windows[wn]
		wi := &keyfoldv1.WindowInfo{Name: wn, Kind: w.Type, Size: optDuration(w.Size), Gap: optDuration(w.Gap), Aggregates: w.Aggregates}
		if w.Type == "sliding" { // a tumbling window's slide is its size: not a setting of its own
			wi.Slide = optDuration(w.Slide)
		}
		if w.Aggregates == nil { // none listed: all of them
			wi.Aggregates = aggregates
		}
		info.Windows = append(info.Windows, wi)
	}
	for _, pn := range slices.Sorted(maps.Keys(spec.Patterns)) {
		ps := spec.Patterns[pn]
		pi := &keyfoldv1.PatternInfo{Name: pn, Within: durationpb.New(ps.Within)}
		// The forms are exclusive (the configuration was validated): the
		// same tests as the compiler's.
		switch {
		case ps.Where != "" || ps.Count != 0:
			pi.Kind, pi.Where, pi.Count = "threshold", ps.Where, uint32(ps.Count)
		case ps.Sequence != nil:
			pi.Kind, pi.Sequence = "sequence", ps.Sequence
		default:
			pi.Kind, pi.After, pi.Absent = "absence", ps.After, ps.Absent
		}
		info.Patterns = append(info.Patterns, pi)
	}
	return info
}

// describeJoins describes the node's joins, sorted by name, as both
// transports answer them (ListPipelines' and GET /v1/pipelines' joins).
func (n *Node) describeJoins() []*keyfoldv1.JoinInfo {
	out := make([]*keyfoldv1.JoinInfo, 0, len(n.cfg.Joins))
	for _, name := range slices.Sorted(maps.Keys(n.cfg.Joins)) {
		out = append(out, describeJoin(name, n.cfg.Joins[name], n.pipelines[name]))
	}
	return out
}

// describeJoin describes one join: its configuration spec (validated) with
// the defaults filled in; what its kind takes none of stays unset.
func describeJoin(name string, spec JoinConfig, p *fold.Pipeline) *keyfoldv1.JoinInfo {
	side := func(s fold.JoinSideSpec) *keyfoldv1.JoinSideInfo {
		return &keyfoldv1.JoinSideInfo{Pipeline: s.Pipeline, Fields: s.Fields}
	}
	info := &keyfoldv1.JoinInfo{
		Name: name, Kind: spec.Type, Mode: cmp.Or(spec.Mode, "inner"), Left: side(spec.Left), Right: side(spec.Right),
		OutOfOrderness:  durationpb.New(spec.OutOfOrderness),
		IdleTimeout:     durationpb.New(cmp.Or(spec.IdleTimeout, fold.DefaultIdleTimeout)),
		OutputRetention: durationpb.New(p.OutputRetention()),
	}
	switch spec.Type {
	case "interval":
		info.Lower, info.Upper = durationpb.New(*spec.Lower), durationpb.New(*spec.Upper)
	case "window":
		info.Window = cmp.Or(spec.Window, "tumbling")
		info.Size, info.Gap = optDuration(spec.Size), optDuration(spec.Gap)
		if info.Window == "sliding" {
			info.Slide = optDuration(spec.Slide)
		}
	}
	if spec.Type != "temporal" {
		info.AllowedLateness = durationpb.New(spec.AllowedLateness)
	}
	return info
}

// optDuration is d as a message, or nil (unset) for 0: a window's size,
// slide or gap is 0 exactly when its kind takes none.
func optDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}
