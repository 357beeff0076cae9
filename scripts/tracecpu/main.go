// Command tracecpu reads a Go execution trace of a keyfold node (from its
// `serve --pprof` address: /debug/pprof/trace?seconds=N) and prints, per
// interval, what the node's goroutines did, by the part of keyfold they
// belong to: where the CPU went while acks were slow, and whether a
// goroutine waited for a CPU, for a lock or for work.
//
//	go run ./scripts/tracecpu cpu TRACE [INTERVAL]       # ms of CPU per part per interval (default 250ms)
//	go run ./scripts/tracecpu states TRACE STACK [INTERVAL]
//	    # ms per state (running, runnable, syscall, waiting and why) per interval,
//	    # of the goroutines whose stack ever contains STACK (a function name)
//
// It is a module of its own (golang.org/x/exp/trace is not a dependency of
// keyfold's): run it from this directory, or with -C. BENCHMARKS.md,
// session 30, has an example of its use.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "tracecpu:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: tracecpu cpu TRACE [INTERVAL] | tracecpu states TRACE STACK [INTERVAL]")
	}
	interval := 250 * time.Millisecond
	last := args[len(args)-1]
	if d, err := time.ParseDuration(last); err == nil && len(args) > 2 {
		interval, args = d, args[:len(args)-1]
	}
	f, err := os.Open(args[1])
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return err
	}
	switch {
	case args[0] == "cpu" && len(args) == 2:
		return cpu(r, interval)
	case args[0] == "states" && len(args) == 3:
		return states(r, args[2], interval)
	}
	return fmt.Errorf("unknown command or arguments %q", args)
}

// parts are the parts of a node, by a function on their goroutines'
// stacks, first match wins.
var parts = []struct{ name, match string }{
	{"commit", "actors.(*Host).commitLoop"},
	{"workers", "actors.(*workerDispatcher).work"},
	{"checkpoint", "actors.(*Host).checkpoint"},
	{"passivate", "actors.(*Host).passivate"},
	{"ingest", "google.golang.org/grpc"},
	{"pebble-bg", "pebble/v2.(*DB).compact"},
	{"pebble-bg", "pebble/v2.(*DB).flush"},
	{"pebble", "cockroachdb/pebble"},
	{"gc", "runtime.gcBgMarkWorker"},
}

func partOf(st trace.Stack) string {
	var b strings.Builder
	for f := range st.Frames() {
		b.WriteString(f.Func)
		b.WriteByte(';')
	}
	s := b.String()
	for _, p := range parts {
		if strings.Contains(s, p.match) {
			return p.name
		}
	}
	return ""
}

// table accumulates milliseconds per column per interval.
type table struct {
	t0       trace.Time
	interval time.Duration
	rows     map[int64]map[string]float64
}

// add spreads [from, to) over the intervals it spans.
func (t *table) add(col string, from, to trace.Time) {
	for from < to {
		i := int64(from.Sub(t.t0) / t.interval)
		end := t.t0 + trace.Time((i+1)*int64(t.interval))
		if end > to {
			end = to
		}
		if t.rows[i] == nil {
			t.rows[i] = map[string]float64{}
		}
		t.rows[i][col] += float64(end-from) / 1e6
		from = end
	}
}

func (t *table) print(cols []string, unit string) {
	fmt.Printf("%8s", "t(s)")
	for _, c := range cols {
		fmt.Printf(" %10s", c[:min(10, len(c))])
	}
	fmt.Printf("   (%s per %v)\n", unit, t.interval)
	var is []int64
	for i := range t.rows {
		is = append(is, i)
	}
	slices.Sort(is)
	for _, i := range is {
		fmt.Printf("%8.2f", (time.Duration(i) * t.interval).Seconds())
		for _, c := range cols {
			fmt.Printf(" %10.0f", t.rows[i][c])
		}
		fmt.Println()
	}
}

// cpu prints the CPU time of each part per interval: a goroutine's time
// running counts towards the part its stack names (the last stack it was
// seen with that names one).
func cpu(r *trace.Reader, interval time.Duration) error {
	t := &table{interval: interval, rows: map[int64]map[string]float64{}}
	running := map[trace.GoID]trace.Time{}
	part := map[trace.GoID]string{}
	err := each(r, func(ev *trace.Event) {
		if t.t0 == 0 {
			t.t0 = ev.Time()
		}
		st := ev.StateTransition()
		id := st.Resource.Goroutine()
		if p := partOf(st.Stack); p != "" {
			part[id] = p
		}
		from, to := st.Goroutine()
		switch {
		case to == trace.GoRunning:
			running[id] = ev.Time()
		case from == trace.GoRunning:
			if at, ok := running[id]; ok {
				p := part[id]
				if p == "" {
					p = "other"
				}
				t.add(p, at, ev.Time())
				delete(running, id)
			}
		}
	})
	cols := []string{"commit", "workers", "ingest", "checkpoint", "passivate", "pebble-bg", "pebble", "gc", "other"}
	t.print(cols, "ms of CPU")
	return err
}

// states prints, per interval, the time the goroutines whose stack names
// match spent in each state; waiting is split by its reason.
func states(r *trace.Reader, match string, interval time.Duration) error {
	t := &table{interval: interval, rows: map[int64]map[string]float64{}}
	mine := map[trace.GoID]bool{}
	since := map[trace.GoID]trace.Time{}
	state := map[trace.GoID]string{}
	cols := map[string]bool{}
	err := each(r, func(ev *trace.Event) {
		if t.t0 == 0 {
			t.t0 = ev.Time()
		}
		st := ev.StateTransition()
		id := st.Resource.Goroutine()
		if !mine[id] {
			for f := range st.Stack.Frames() {
				if strings.Contains(f.Func, match) {
					mine[id] = true
					break
				}
			}
			if !mine[id] {
				return
			}
		}
		if at, ok := since[id]; ok {
			t.add(state[id], at, ev.Time())
		}
		_, to := st.Goroutine()
		s := strings.ToLower(to.String())
		if to == trace.GoWaiting && st.Reason != "" {
			s = "wait:" + st.Reason
		}
		since[id], state[id] = ev.Time(), s
		cols[s] = true
	})
	var cs []string
	for c := range cols {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	t.print(cs, "ms")
	return err
}

// each calls f for every goroutine state transition in the trace.
func each(r *trace.Reader, f func(*trace.Event)) error {
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if ev.Kind() == trace.EventStateTransition && ev.StateTransition().Resource.Kind == trace.ResourceGoroutine {
			f(&ev)
		}
	}
}
