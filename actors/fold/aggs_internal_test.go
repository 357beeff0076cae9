package fold

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestAggSetAgainstModel drives a set of mixed aggregates, three of them
// last values, with values of changing lengths (empty among them, as a
// restored aggregate may have), and compares every aggregate with a model
// after each step: the values moving within the set's bytes must never
// overwrite another's, nor the counts and numbers in front of them.
func TestAggSetAgainstModel(t *testing.T) {
	ops := []Op{OpLast, OpCount, OpLast, OpSum, OpMin, OpLast, OpMax}
	type model struct {
		count uint64
		num   float64
		last  []byte
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 100 {
		var a aggSet
		if run%2 == 1 {
			a = makeAggSet(len(ops), rng.IntN(20))
		}
		want := make([]model, len(ops))
		for step := range 300 {
			i := rng.IntN(len(ops))
			m := &want[i]
			num := float64(rng.IntN(2001) - 1000)
			var v []byte
			if ops[i] == OpLast {
				v = []byte(strconv.Quote(string(bytes.Repeat([]byte{byte('a' + step%26)}, rng.IntN(12)))))
			}
			if ops[i] == OpLast && rng.IntN(10) == 0 { // restored: a count and maybe no value
				if rng.IntN(2) == 0 {
					v = nil
				}
				if a.b == nil {
					a = makeAggSet(len(ops), 0)
				}
				a.restore(ops, i, 7, 0, v)
				m.count, m.last = 7, bytes.Clone(v)
			} else {
				kept := bytes.Clone(v)
				c := contribution{ok: true, num: num, val: v}
				a.add(ops, i, &c)
				for j := range c.val {
					c.val[j] = '!' // the set keeps its own copy
				}
				switch ops[i] {
				case OpSum:
					m.num += num
				case OpMin:
					if m.count == 0 || num < m.num {
						m.num = num
					}
				case OpMax:
					if m.count == 0 || num > m.num {
						m.num = num
					}
				case OpLast:
					m.last = kept
				}
				m.count++
			}
			for j, op := range ops {
				if got := a.count(j); got != want[j].count {
					t.Fatalf("run %d step %d: aggregate %d: count %d, want %d", run, step, j, got, want[j].count)
				}
				if op == OpLast {
					if got := a.last(j); !bytes.Equal(got, want[j].last) || (got == nil) != (len(want[j].last) == 0) {
						t.Fatalf("run %d step %d: aggregate %d: last %q, want %q", run, step, j, got, want[j].last)
					}
				} else if got := a.numOf(op, j); got != want[j].num {
					t.Fatalf("run %d step %d: aggregate %d: number %v, want %v", run, step, j, got, want[j].num)
				}
			}
			if total := func() (n int) {
				for j, op := range ops {
					if op == OpLast {
						n += len(want[j].last)
					}
				}
				return n
			}(); len(a.b) != len(ops)*aggSlot+total {
				t.Fatalf("run %d step %d: %d bytes, want %d (the values and no more)", run, step, len(a.b), len(ops)*aggSlot+total)
			}
		}
	}
}

// TestAggSetMerge merges sessions' sets as mergeWindows does: counts add,
// numbers follow their op, and the newer set's last value wins, copied.
func TestAggSetMerge(t *testing.T) {
	ops := []Op{OpCount, OpLast, OpSum, OpLast}
	var a, b aggSet
	a.add(ops, 1, &contribution{ok: true, val: []byte(`"a"`)})
	a.add(ops, 2, &contribution{ok: true, num: 2})
	b.add(ops, 0, &contribution{ok: true})
	b.add(ops, 1, &contribution{ok: true, val: []byte(`"longer"`)})
	b.add(ops, 2, &contribution{ok: true, num: 3})
	b.add(ops, 3, &contribution{ok: true, val: []byte(`4`)})
	older := a
	older.b = bytes.Clone(a.b)
	older.merge(ops, 0, &b, false)
	older.merge(ops, 1, &b, false)
	if got := older.last(1); string(got) != `"a"` || older.count(0) != 1 || older.count(1) != 2 {
		t.Fatalf("merged from an older session: last %s, counts %d %d", got, older.count(0), older.count(1))
	}
	for i := range ops {
		a.merge(ops, i, &b, true)
	}
	b.setLast(ops, 1, []byte(`"x"`)) // a holds a copy
	if got, want := []any{a.count(0), string(a.last(1)), a.num(2), string(a.last(3))}, []any{uint64(1), `"longer"`, 5.0, `4`}; !equalAny(got, want) {
		t.Fatalf("merged: %v, want %v", got, want)
	}
}

func equalAny(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLastValueAnswersAreCopies: what a query or a state's message holds
// of a last value stays as it was when the key applies more events (the
// set changes its bytes in place, and an answer is read after the key's
// actor moved on).
func TestLastValueAnswersAreCopies(t *testing.T) {
	p, err := Compile("p", Spec{Key: "k", Aggregates: map[string]AggregateSpec{"country": {Op: "last", Field: "c"}}})
	if err != nil {
		t.Fatal(err)
	}
	var s State
	apply := func(raw string) {
		t.Helper()
		ev, err := p.Prepare([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		p.Apply(&s, ev, 1)
	}
	apply(`{"k":"a","c":"DE"}`)
	answer := p.Aggregates(&s)["country"]
	ks, err := p.StateProto(&s)
	if err != nil {
		t.Fatal(err)
	}
	apply(`{"k":"a","c":"FR"}`) // the same length: set in place
	if got := string(answer.(json.RawMessage)); got != `"DE"` {
		t.Errorf("the answer read before the second event says %s", got)
	}
	if got := string(ks.Aggregates[0].LastJson); got != `"DE"` {
		t.Errorf("the message built before the second event says %s", got)
	}
	if got := string(p.Aggregates(&s)["country"].(json.RawMessage)); got != `"FR"` {
		t.Errorf("the key says %s, want \"FR\"", got)
	}
}
