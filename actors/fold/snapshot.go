package fold

import (
	"fmt"

	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"google.golang.org/protobuf/proto"
)

// MarshalState encodes a key's state (keyfold.v1.KeyState). Aggregates are
// stored by name, so a pipeline may gain or lose aggregates between runs.
func (p *Pipeline) MarshalState(s *State) ([]byte, error) {
	return proto.Marshal(p.StateProto(s))
}

// StateProto returns a key's state as its persisted message.
func (p *Pipeline) StateProto(s *State) *keyfoldv1.KeyState {
	ks := &keyfoldv1.KeyState{Seq: s.seq, NowMs: s.now}
	for i, agg := range p.aggs {
		if i >= len(s.aggs) || s.aggs[i].count == 0 {
			continue
		}
		a := s.aggs[i]
		ks.Aggregates = append(ks.Aggregates, &keyfoldv1.AggregateState{
			Name: agg.name, Op: agg.op.String(), Count: a.count, Number: a.num, LastJson: a.last,
		})
	}
	for _, e := range s.order {
		ks.Seen = append(ks.Seen, &keyfoldv1.SeenID{Id: e.id, AtMs: e.at})
	}
	return ks
}

// UnmarshalState decodes a state written by MarshalState. Aggregates the
// pipeline no longer has are dropped; new ones, and ones whose op changed,
// start empty.
func (p *Pipeline) UnmarshalState(b []byte) (State, error) {
	var ks keyfoldv1.KeyState
	if err := proto.Unmarshal(b, &ks); err != nil {
		return State{}, fmt.Errorf("fold: decode state: %w", err)
	}
	return p.StateFromProto(&ks)
}

// StateFromProto rebuilds a key's state from its persisted message (nil is
// the empty state).
func (p *Pipeline) StateFromProto(ks *keyfoldv1.KeyState) (State, error) {
	if ks == nil {
		return State{}, nil
	}
	s := State{seq: ks.Seq, now: ks.NowMs, aggs: make([]aggState, len(p.aggs))}
	byName := make(map[string]int, len(p.aggs))
	for i, a := range p.aggs {
		byName[a.name] = i
	}
	for _, a := range ks.Aggregates {
		if i, ok := byName[a.Name]; ok && (a.Op == "" || a.Op == p.aggs[i].op.String()) {
			s.aggs[i] = aggState{count: a.Count, num: a.Number, last: a.LastJson}
		}
	}
	if len(ks.Seen) > 0 {
		s.seen = make(map[string]int64, len(ks.Seen))
		s.order = make([]seenID, 0, len(ks.Seen))
		for _, e := range ks.Seen {
			s.seen[e.Id] = e.AtMs
			s.order = append(s.order, seenID{id: e.Id, at: e.AtMs})
		}
	}
	return s, nil
}
