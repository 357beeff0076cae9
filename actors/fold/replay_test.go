package fold

import "testing"

// TestReplayNeverRejects: an event accepted under an earlier configuration
// still counts on replay, and its id is still remembered, even where it no
// longer validates.
func TestReplayNeverRejects(t *testing.T) {
	p, err := Compile("p", Spec{
		Key: "k", ID: "id", Time: "ts",
		Aggregates: map[string]AggregateSpec{
			"n":   {Op: "count"},
			"sum": {Op: "sum", Field: "amount"},
			"big": {Op: "count", Where: "amount > 10"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	raws := []string{
		`{"k":"a","id":"1","amount":"lots"}`, // sum and the filter reject it now
		`{"k":"a","id":"2","ts":true}`,       // so does the time
		`not json at all`,                    // a corrupt payload still counts
		`{"k":"a","id":"1","amount":5}`,      // id 1 was remembered
		`{"k":"a","id":"3","amount":20}`,
	}
	var s State
	dups := 0
	for i, raw := range raws {
		if _, err := p.Prepare([]byte(raw)); err == nil && i < 3 {
			t.Fatalf("%s: Prepare accepted it; the test needs an event it rejects", raw)
		}
		ev := p.Replay([]byte(raw), "a")
		if ev.Key != "a" {
			t.Fatalf("Replay key = %q", ev.Key)
		}
		if p.Apply(&s, ev, int64(i)) {
			dups++
		}
	}
	got := p.Aggregates(&s)
	if s.Seq() != 4 || dups != 1 || got["n"] != uint64(4) || got["sum"] != float64(20) || got["big"] != uint64(1) {
		t.Errorf("seq %d, dups %d, aggregates %v", s.Seq(), dups, got)
	}
}

func TestWhereRejectsOrderDependentBuiltins(t *testing.T) {
	for _, src := range []string{"keys(attrs)[0] == 'a'", "any(values(attrs), # > 1)", "len(toPairs(attrs)) > 0", "date(ts).Local().Hour() == 0"} {
		if _, err := compileWhere(src); err == nil {
			t.Errorf("%s compiled; its answer depends on map order", src)
		}
	}
	// Zoneless dates parse as UTC whatever the machine's zone (TZ=Asia/Tokyo
	// was checked by hand).
	w, err := compileWhere("date('2020-01-01 00:00:00', '2006-01-02 15:04:05').Hour() == 0")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := w.match(map[string]any{}); !ok || err != nil {
		t.Errorf("a zoneless date is not UTC: %v %v", ok, err)
	}
}
