package keyfold_test

// The outputs API end to end on an in-process node: window results read
// page by page over HTTP, streamed as Server-Sent Events across a
// reconnection, read through Node.Subscribe, and shown by key queries.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/services/servicetest"
)

// outputsYAML: a 1 s tumbling window on ingest time (no time field, so the
// watermark is the clock and a window closes about a second after it
// opens).
const outputsYAML = `
pipelines:
  clicks:
    key: page
    id: id
    aggregates:
      n:     { op: count }
      total: { op: sum, field: amount }
    windows:
      second: { type: tumbling, size: 1s }
`

// outputsWindows is outputsYAML's windows: entry, as ParseConfig must read
// it.
var outputsWindows = map[string]fold.WindowSpec{"second": {Type: "tumbling", Size: time.Second}}

// TestOutputsWindowsFromYAML: ParseConfig reads a pipeline's windows (and
// so the CLI's config file can declare them), and rejects unknown keys and
// bad types in them as it does in aggregates.
func TestOutputsWindowsFromYAML(t *testing.T) {
	cfg, err := keyfold.ParseConfig([]byte(outputsYAML))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Pipelines["clicks"].Windows; !reflect.DeepEqual(got, outputsWindows) {
		t.Errorf("ParseConfig: clicks windows %+v, want %+v", got, outputsWindows)
	}
	for _, c := range []struct{ window, problem string }{
		{"{ type: tumbling, size: 1s, colour: red }", `unknown key "colour"`},
		{"{ type: nonsense, size: 1s }", `"nonsense"`},
	} {
		_, err = keyfold.ParseConfig([]byte(outputsYAML + "      bad: " + c.window + "\n"))
		if err == nil || !strings.Contains(err.Error(), "windows.bad") || !strings.Contains(err.Error(), c.problem) {
			t.Errorf("ParseConfig of window %s: %v, want an error about windows.bad naming %s", c.window, err, c.problem)
		}
	}
}

// outputsNode runs a node with HTTP on a free port and returns it and its
// base URL. The windows are set in Go as well, so that this test does not
// depend on ParseConfig reading them (TestOutputsWindowsFromYAML checks that).
func outputsNode(t *testing.T) (*keyfold.Node, string) {
	t.Helper()
	cfg := servicetest.Config(t, outputsYAML)
	p := cfg.Pipelines["clicks"]
	p.Windows = outputsWindows
	cfg.Pipelines["clicks"] = p
	cfg.HTTPAddr = "127.0.0.1:0"
	n := servicetest.Run(t, cfg)
	return n, "http://" + n.HTTPAddr()
}

// clickWave is one POST of events to the clicks pipeline: every event of it
// gets the same ingest time, so each key's events land in one window.
type clickWave struct {
	sent          map[string][2]int64 // key → count, sum
	before, after time.Time           // around the request
}

// postClicks posts count[i] events for keys[i], each with amount i+1 and a
// fresh id, and checks they are all accepted.
func postClicks(t *testing.T, base, wave string, keys []string, counts []int) clickWave {
	t.Helper()
	w := clickWave{sent: map[string][2]int64{}}
	var evs []map[string]any
	for i, k := range keys {
		for j := range counts[i] {
			amount := int64(10*i + j + 1)
			evs = append(evs, map[string]any{"page": k, "id": fmt.Sprintf("%s-%s-%d", wave, k, j), "amount": amount})
			s := w.sent[k]
			w.sent[k] = [2]int64{s[0] + 1, s[1] + amount}
		}
	}
	body, err := json.Marshal(evs)
	if err != nil {
		t.Fatal(err)
	}
	w.before = time.Now()
	resp, err := http.Post(base+"/v1/pipelines/clicks/events", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	w.after = time.Now()
	var r keyfold.IngestResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Accepted != len(evs) {
		t.Fatalf("POST %s: %d %+v %v, want %d accepted", wave, resp.StatusCode, r, err, len(evs))
	}
	return w
}

// outputsPage is the body of GET …/outputs.
type outputsPage struct {
	Outputs []keyfold.Output `json:"outputs"`
	Next    string           `json:"next"`
}

// getJSON GETs url and decodes a JSON body into v; it returns the status.
// Every answer, error or not, must be JSON.
func getJSON(t *testing.T, u string, v any) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET %s: Content-Type %q, want application/json (body %q)", u, ct, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %d, body %q: %v", u, resp.StatusCode, b, err)
	}
	return resp.StatusCode
}

// readOutputs reads the whole log with GET …/outputs?limit=limit, checking
// each page's next, and returns the outputs and the number of pages read
// (the last one empty).
func readOutputs(t *testing.T, base string, limit int) ([]keyfold.Output, int) {
	t.Helper()
	var all []keyfold.Output
	after := ""
	for pages := 1; ; pages++ {
		u := fmt.Sprintf("%s/v1/pipelines/clicks/outputs?limit=%d", base, limit)
		if after != "" {
			u += "&after=" + url.QueryEscape(after)
		}
		var p outputsPage
		if code := getJSON(t, u, &p); code != http.StatusOK {
			t.Fatalf("GET %s: %d %+v", u, code, p)
		}
		if len(p.Outputs) > limit {
			t.Fatalf("GET %s: %d outputs, more than the limit", u, len(p.Outputs))
		}
		want := after
		if len(p.Outputs) > 0 {
			want = p.Outputs[len(p.Outputs)-1].Cursor
		}
		if p.Next != want {
			t.Fatalf("GET %s: next %q, want %q (the last cursor, or after when empty)", u, p.Next, want)
		}
		all = append(all, p.Outputs...)
		if len(p.Outputs) == 0 {
			return all, pages
		}
		after = p.Next
	}
}

// waitForOutputs polls the log until it holds at least n outputs.
func waitForOutputs(t *testing.T, base string, n int) []keyfold.Output {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, _ := readOutputs(t, base, 100)
		if len(all) >= n {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d outputs; the log holds %d", n, len(all))
		}
		time.Sleep(20 * time.Millisecond) // polling interval, with a deadline
	}
}

// checkWave checks the outputs of one wave against what it sent: one result
// per key, revision 0, of the 1 s window holding the wave's ingest time,
// with the count and sum sent, emitted once the watermark passed its end.
// It returns the largest delay from a window's end to its result being
// stored.
func checkWave(t *testing.T, w clickWave, outs []keyfold.Output) time.Duration {
	t.Helper()
	if len(outs) != len(w.sent) {
		t.Fatalf("%d outputs for a wave of %d keys: %+v", len(outs), len(w.sent), outs)
	}
	var lag time.Duration
	seen := map[string]bool{}
	for _, o := range outs {
		want, ok := w.sent[o.Key]
		if !ok || seen[o.Key] {
			t.Errorf("output %s: key %q was not sent in this wave, or has two results", o.ID, o.Key)
			continue
		}
		seen[o.Key] = true
		var v struct{ N, Total float64 }
		if err := json.Unmarshal(o.Values, &v); err != nil {
			t.Errorf("output %s: values %s: %v", o.ID, o.Values, err)
		}
		wantID := fmt.Sprintf("clicks/%s/second/%d-%d/0", o.Key, o.Start.UnixMilli(), o.End.UnixMilli())
		switch {
		case o.ID != wantID:
			t.Errorf("output id %q, want %q", o.ID, wantID)
		case o.Pipeline != "clicks" || o.Kind != "tumbling" || o.Name != "second" || o.Revision != 0:
			t.Errorf("output %s: %+v", o.ID, o)
		case o.Start.UnixMilli()%1000 != 0 || o.End.Sub(o.Start) != time.Second:
			t.Errorf("output %s: window [%v, %v) is not a second aligned to one", o.ID, o.Start, o.End)
		case o.Start.After(w.after) || !o.End.After(w.before.Truncate(time.Millisecond)):
			t.Errorf("output %s: window [%v, %v) does not hold the ingest time, between %v and %v", o.ID, o.Start, o.End, w.before, w.after)
		case o.Count != uint64(want[0]) || v.N != float64(want[0]) || v.Total != float64(want[1]):
			t.Errorf("output %s: count %d, values %s; want count %d, total %d", o.ID, o.Count, o.Values, want[0], want[1])
		case o.Watermark.Before(o.End) || o.Stored.Before(o.End):
			t.Errorf("output %s of window ending %v: watermark %v, stored %v; want both at or after the end", o.ID, o.End, o.Watermark, o.Stored)
		case o.Cursor == "":
			t.Errorf("output %s has no cursor", o.ID)
		}
		lag = max(lag, o.Stored.Sub(o.End))
	}
	return lag
}

// checkKeyQuery checks GET …/keys/{key} of a windowed key right after its
// wave: it shows the key's watermark and, unless the window closed in the
// meantime, the open window with what was sent. It reports whether the
// window was still open.
func checkKeyQuery(t *testing.T, base, key string, want [2]int64) (open bool) {
	t.Helper()
	var ks keyfold.KeyState
	u := base + "/v1/pipelines/clicks/keys/" + key
	if code := getJSON(t, u, &ks); code != http.StatusOK {
		t.Fatalf("GET %s: %d", u, code)
	}
	if ks.Watermark == nil || ks.Late == nil || ks.Windows == nil {
		t.Fatalf("GET %s: watermark %v, late %v, windows %v; a windowed key shows all three", u, ks.Watermark, ks.Late, ks.Windows)
	}
	if *ks.Late != 0 {
		t.Errorf("GET %s: late %d, want 0 on ingest time", u, *ks.Late)
	}
	for _, w := range ks.Windows {
		if w.Emitted != 0 {
			continue // an earlier wave's window, if kept
		}
		if w.Name != "second" || w.Kind != "tumbling" || w.End.Sub(w.Start) != time.Second || w.Count != uint64(want[0]) {
			t.Errorf("GET %s: window %+v; want a 1 s tumbling window named second with %d events", u, w, want[0])
		}
		if !ks.Watermark.Before(w.End) {
			t.Errorf("GET %s: open window ends %v, at or before the watermark %v", u, w.End, *ks.Watermark)
		}
		return true
	}
	return false
}

// sseEvent is one Server-Sent Event.
type sseEvent struct{ id, event, data string }

// sseStream is a connection to …/outputs/stream.
type sseStream struct {
	events <-chan sseEvent // closed when the stream ends
	cancel context.CancelFunc
}

// openStream connects to the outputs stream with Last-Event-ID lastID (if
// set) and query (if set), checks the answer, and parses events in the
// background. The connection is closed when the test ends.
func openStream(t *testing.T, base, lastID, query string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	u := base + "/v1/pipelines/clicks/outputs/stream" + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: %d %q: %s", u, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	events := make(chan sseEvent)
	go func() {
		defer close(events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev != (sseEvent{}) {
					select {
					case events <- ev:
					case <-ctx.Done():
						return
					}
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"): // a comment
			default:
				field, value, _ := strings.Cut(line, ":")
				value = strings.TrimPrefix(value, " ")
				switch field {
				case "id":
					ev.id = value
				case "event":
					ev.event = value
				case "data":
					if ev.data != "" {
						ev.data += "\n"
					}
					ev.data += value
				}
			}
		}
	}()
	s := &sseStream{events: events, cancel: cancel}
	t.Cleanup(s.close) // before the node's Close, which waits for open requests
	return s
}

func (s *sseStream) close() {
	s.cancel()
	for range s.events { // until the reader is done
	}
}

// next returns the stream's next output event, failing the test if none
// comes within timeout or the event is malformed.
func (s *sseStream) next(t *testing.T, timeout time.Duration) keyfold.Output {
	t.Helper()
	select {
	case ev, ok := <-s.events:
		if !ok {
			t.Fatal("the output stream ended")
		}
		var o keyfold.Output
		if ev.event != "output" {
			t.Fatalf("stream event %q (data %s), want output", ev.event, ev.data)
		}
		if err := json.Unmarshal([]byte(ev.data), &o); err != nil {
			t.Fatalf("stream event data %q: %v", ev.data, err)
		}
		if ev.id != o.Cursor {
			t.Fatalf("stream event id %q, but its output's cursor is %q", ev.id, o.Cursor)
		}
		return o
	case <-time.After(timeout):
		t.Fatalf("no output on the stream within %v", timeout)
	}
	panic("unreachable")
}

// sameOutputs compares two sequences of outputs by id and cursor.
func sameOutputs(t *testing.T, what string, got, want []keyfold.Output) {
	t.Helper()
	str := func(outs []keyfold.Output) string {
		s := make([]string, len(outs))
		for i, o := range outs {
			s[i] = o.Cursor + "=" + o.ID
		}
		return strings.Join(s, "\n  ")
	}
	if g, w := str(got), str(want); g != w {
		t.Fatalf("%s:\n got\n  %s\n want\n  %s", what, g, w)
	}
}

// TestOutputsHTTP: window results read with GET …/outputs page by page,
// its argument errors, the SSE stream resumed with Last-Event-ID, key
// queries of a windowed key, and Node.Subscribe from a cursor.
func TestOutputsHTTP(t *testing.T) {
	start := time.Now()
	n, base := outputsNode(t)
	open := 0

	// An empty log: one empty page whose next is the request's after.
	if all, pages := readOutputs(t, base, 2); len(all) != 0 || pages != 1 {
		t.Fatalf("empty log: %d outputs in %d pages", len(all), pages)
	}

	// Wave 1: five keys, 1 to 5 events each.
	keys1 := []string{"a", "b", "c", "d", "e"}
	w1 := postClicks(t, base, "w1", keys1, []int{1, 2, 3, 4, 5})
	if checkKeyQuery(t, base, "e", w1.sent["e"]) {
		open++
	}
	all := waitForOutputs(t, base, len(keys1))
	lag := checkWave(t, w1, all)

	// Pages of two: 2, 2, 1, then an empty page; the same outputs in the
	// same order as one page of 100.
	paged, pages := readOutputs(t, base, 2)
	if pages != 4 {
		t.Errorf("five outputs read in pages of 2 took %d pages, want 4 (2+2+1, then an empty one)", pages)
	}
	sameOutputs(t, "pages of 2 against one page", paged, all)

	// After the results, the key shows its watermark past the window, and
	// no window (without allowed lateness it is dropped once emitted).
	var ks keyfold.KeyState
	if code := getJSON(t, base+"/v1/pipelines/clicks/keys/e", &ks); code != http.StatusOK || ks.Watermark == nil || ks.Windows == nil {
		t.Fatalf("GET keys/e: %d %+v", code, ks)
	}
	if eOut := all[slices.IndexFunc(all, func(o keyfold.Output) bool { return o.Key == "e" })]; ks.Watermark.Before(eOut.End) || len(ks.Windows) != 0 || ks.Seq != 5 {
		t.Errorf("GET keys/e after its result: seq %d, watermark %v, windows %+v; want seq 5, watermark at or after %v, no windows", ks.Seq, ks.Watermark, ks.Windows, eOut.End)
	}

	// Argument errors: 400 or 404 with a JSON error, on both endpoints.
	for _, c := range []struct {
		path string
		want int
	}{
		{"/v1/pipelines/clicks/outputs?limit=0", http.StatusBadRequest},
		{"/v1/pipelines/clicks/outputs?limit=-1", http.StatusBadRequest},
		{"/v1/pipelines/clicks/outputs?limit=abc", http.StatusBadRequest},
		{"/v1/pipelines/clicks/outputs?limit=10001", http.StatusBadRequest},
		{"/v1/pipelines/clicks/outputs?after=garbage", http.StatusBadRequest},
		{"/v1/pipelines/clicks/outputs?after=-1", http.StatusBadRequest},
		{"/v1/pipelines/clicks/outputs?after=99999999", http.StatusBadRequest}, // past the end
		{"/v1/pipelines/nope/outputs", http.StatusNotFound},
		{"/v1/pipelines/clicks/outputs/stream?after=garbage", http.StatusBadRequest},
		{"/v1/pipelines/nope/outputs/stream", http.StatusNotFound},
	} {
		var e struct{ Error string }
		if code := getJSON(t, base+c.path, &e); code != c.want || e.Error == "" {
			t.Errorf("GET %s: %d %+v, want %d with an error message", c.path, code, e, c.want)
		}
		for _, layer := range []string{"embedded:", "persistence:", "redisstore:", "actors:"} {
			if strings.Contains(e.Error, layer) {
				t.Errorf("GET %s: the message %q shows an internal layer (%s)", c.path, e.Error, layer)
			}
		}
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/pipelines/clicks/outputs/stream", nil)
	req.Header.Set("Last-Event-ID", "garbage")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("stream with Last-Event-ID garbage: %d, want 400", resp.StatusCode)
		}
	}
	if _, err := n.Outputs(context.Background(), "clicks", "garbage", 10); !errors.Is(err, keyfold.ErrBadArgument) {
		t.Errorf("Node.Outputs after a garbage cursor: %v, want ErrBadArgument", err)
	}
	if _, err := n.Outputs(context.Background(), "clicks", "", 0); !errors.Is(err, keyfold.ErrBadArgument) {
		t.Errorf("Node.Outputs with limit 0: %v, want ErrBadArgument", err)
	}
	if _, err := n.Outputs(context.Background(), "nope", "", 10); !errors.Is(err, keyfold.ErrUnknownPipeline) {
		t.Errorf("Node.Outputs of an unknown pipeline: %v, want ErrUnknownPipeline", err)
	}

	// SSE: ?after= starts after that output.
	s := openStream(t, base, "", "?after="+url.QueryEscape(all[0].Cursor))
	sameOutputs(t, "stream ?after=the first cursor", []keyfold.Output{s.next(t, 5*time.Second)}, all[1:2])
	s.close()

	// SSE from the start: read three, disconnect.
	s = openStream(t, base, "", "")
	var got []keyfold.Output
	for range 3 {
		got = append(got, s.next(t, 5*time.Second))
	}
	sameOutputs(t, "first three on the stream", got, all[:3])
	s.close()

	// Reconnect with Last-Event-ID, then send more: the stream continues
	// with the two left and then the new results as they are stored.
	s = openStream(t, base, got[2].Cursor, "")
	keys2 := []string{"a", "f", "g"}
	w2 := postClicks(t, base, "w2", keys2, []int{2, 1, 3})
	if checkKeyQuery(t, base, "g", w2.sent["g"]) {
		open++
	}
	all = waitForOutputs(t, base, len(keys1)+len(keys2))
	lag = max(lag, checkWave(t, w2, all[len(keys1):]))
	got = got[:0]
	for range len(all) - 3 {
		got = append(got, s.next(t, 10*time.Second))
	}
	// A last wave, whose result must come next on the stream: nothing
	// was repeated in between.
	w3 := postClicks(t, base, "w3", []string{"h"}, []int{4})
	if checkKeyQuery(t, base, "h", w3.sent["h"]) {
		open++
	}
	got = append(got, s.next(t, 10*time.Second))
	all = waitForOutputs(t, base, len(keys1)+len(keys2)+1)
	lag = max(lag, checkWave(t, w3, all[len(all)-1:]))
	sameOutputs(t, "the stream after reconnecting with Last-Event-ID", got, all[3:])
	s.close()
	if open == 0 {
		t.Error("no key query found its window open right after its events")
	}

	// Node.Subscribe from a cursor: the rest, in order, then it waits; it
	// returns nil when its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	var sub []keyfold.Output
	done := make(chan error, 1)
	go func() {
		done <- n.Subscribe(ctx, "clicks", all[1].Cursor, func(o keyfold.Output) error {
			sub = append(sub, o)
			if len(sub) == len(all)-2 {
				cancel()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatalf("Subscribe delivered %d of %d outputs within 10s", len(sub), len(all)-2)
	}
	sameOutputs(t, "Subscribe after the second cursor", sub, all[2:])
	for i, o := range sub {
		if string(o.Values) != string(all[i+2].Values) || o.Count != all[i+2].Count || !o.End.Equal(all[i+2].End) {
			t.Errorf("Subscribe's %s differs from GET's: %+v vs %+v", o.ID, o, all[i+2])
		}
	}
	// An error from fn ends it with that error.
	errStop := errors.New("stop")
	if err := n.Subscribe(context.Background(), "clicks", "", func(keyfold.Output) error { return errStop }); !errors.Is(err, errStop) {
		t.Errorf("Subscribe whose fn fails: %v, want that error", err)
	}
	if err := n.Subscribe(context.Background(), "clicks", "garbage", func(keyfold.Output) error { return nil }); !errors.Is(err, keyfold.ErrBadArgument) {
		t.Errorf("Subscribe after a garbage cursor: %v, want ErrBadArgument", err)
	}
	t.Logf("%d outputs; window end to stored at most %v; key queries saw the window open %d of 3 times; took %v",
		len(all), lag.Round(time.Millisecond), open, time.Since(start).Round(time.Millisecond))
}

// TestOutputsSupersedes: a late event that extends an emitted session emits
// a result under a new id that names the one it replaces (Node.Outputs, so
// HTTP, SSE and gRPC, which serve keyfold.Output); the key's state shows
// its late counts per window.
func TestOutputsSupersedes(t *testing.T) {
	cfg := servicetest.Config(t, `
pipelines:
  visits:
    key: user
    time: ts
    allowed_lateness: 1m
    idle_timeout: 100ms
    aggregates:
      n: { op: count }
    windows:
      s: { type: session, gap: 1s }
`)
	n := servicetest.Run(t, cfg)
	ctx := context.Background()
	t0 := time.Now().UnixMilli() - 10_000
	ingest := func(ts int64) {
		t.Helper()
		ev, _ := json.Marshal(map[string]any{"user": "u", "ts": ts})
		if _, err := n.Ingest(ctx, "visits", []json.RawMessage{ev}); err != nil {
			t.Fatal(err)
		}
	}
	outputs := func(want int) []keyfold.Output {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			outs, err := n.Outputs(ctx, "visits", "", 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) >= want {
				return outs
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %d outputs; %d stored", want, len(outs))
			}
			time.Sleep(20 * time.Millisecond) // polling interval, with a deadline
		}
	}
	ingest(t0)
	first := outputs(1)[0] // idle: the watermark passes the session's end
	ingest(t0 + 800)       // late, within allowed_lateness: extends it to t0 + 1800
	outs := outputs(2)
	want := fmt.Sprintf("visits/u/s/%d-%d/1", t0, t0+1800)
	if got := outs[1]; got.ID != want || !slices.Equal(got.Supersedes, []string{first.ID}) || len(first.Supersedes) != 0 {
		t.Errorf("results %s %v, then %s %v; want the second %s to supersede the first", first.ID, first.Supersedes, got.ID, got.Supersedes, want)
	}
	if b, err := json.Marshal(outs[1]); err != nil || !strings.Contains(string(b), `"supersedes":["`+first.ID+`"]`) {
		t.Errorf("JSON %s (%v) lacks supersedes", b, err)
	}
	ks, err := n.Query(ctx, "visits", "u")
	if err != nil {
		t.Fatal(err)
	}
	if ks.LateWindows == nil || ks.LateWindows["s"] != 0 || *ks.Late != 0 {
		t.Errorf("key state: late %v, late_windows %v; want 0 and s: 0", *ks.Late, ks.LateWindows)
	}
}
