//go:build unix

package main

// End-to-end tests of durable timers and outputs with real processes: keys
// open event-time sessions, the node is killed with SIGKILL before any
// session closes, and after a restart, with nothing more sent to those keys,
// every session must be emitted exactly once (one id per session; the output
// log may hold an id twice, with the same content) with the count and sum an
// oracle computes from the acknowledged events.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

const (
	sessionGroups = 32
	sessionGap    = 2 * time.Second
)

// sessionsYAML: event time from ts (Unix ms), a watermark that trails it by
// nothing and advances with processing time after 1 s without events, and
// one session window. A checkpoint interval of 1 s lets the test place a
// wave of events right after a checkpoint, so that a kill finds it in the
// log tail only.
var sessionsYAML = fmt.Sprintf(`
key_groups: %d
checkpoint_interval: 1s
pipelines:
  visits:
    key: user
    id: id
    time: ts
    out_of_orderness: 0s
    idle_timeout: 1s
    aggregates:
      n:     { op: count }
      spent: { op: sum, field: amount }
    windows:
      visit: { type: session, gap: %v, aggregates: [n, spent] }
`, sessionGroups, sessionGap)

// visitJSON is one event of the visits pipeline.
type visitJSON struct {
	User   string `json:"user"`
	ID     string `json:"id"`
	TS     int64  `json:"ts"`
	Amount int64  `json:"amount"`
}

// sessionExpect is what the oracle says about one key's session.
type sessionExpect struct {
	n, sum      int64
	first, last int64 // event times, Unix ms
	group       uint32
}

// winOutput is one output as GET …/outputs returns it.
type winOutput struct {
	Cursor    string          `json:"cursor"`
	ID        string          `json:"id"`
	Pipeline  string          `json:"pipeline"`
	Key       string          `json:"key"`
	Kind      string          `json:"kind"`
	Name      string          `json:"name"`
	Start     time.Time       `json:"start"`
	End       time.Time       `json:"end"`
	Revision  uint32          `json:"revision"`
	Count     uint64          `json:"count"`
	Values    json.RawMessage `json:"values"`
	Watermark time.Time       `json:"watermark"`
	Stored    time.Time       `json:"stored"`
}

// content is the output without what the store adds (its cursor and when it
// was stored): a result emitted again must have the same.
func (o winOutput) content() winOutput {
	o.Cursor, o.Stored = "", time.Time{}
	var v any
	if json.Unmarshal(o.Values, &v) == nil {
		o.Values, _ = json.Marshal(v) // canonical key order
	}
	return o
}

// allOutputs reads a pipeline's whole output log, a page of limit at a time,
// checking that each page's next is its last cursor (or the request's after
// when the page is empty).
func (n *node) allOutputs(pipeline string, limit int) ([]winOutput, error) {
	var all []winOutput
	after := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if after != "" {
			q.Set("after", after)
		}
		resp, err := n.client.Get(n.base + "/v1/pipelines/" + pipeline + "/outputs?" + q.Encode())
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("outputs after %q: status %d: %s", after, resp.StatusCode, bytes.TrimSpace(body))
		}
		var page struct {
			Outputs []winOutput `json:"outputs"`
			Next    string      `json:"next"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("outputs after %q: decode %q: %w", after, body, err)
		}
		want := after
		if len(page.Outputs) > 0 {
			want = page.Outputs[len(page.Outputs)-1].Cursor
		}
		if page.Next != want {
			return nil, fmt.Errorf("outputs after %q: next is %q, want %q", after, page.Next, want)
		}
		all = append(all, page.Outputs...)
		if len(page.Outputs) < limit {
			return all, nil
		}
		after = page.Next
	}
}

// sessionResults checks a read of the output log: outputs that share an id
// must have the same content; it returns the distinct outputs by id and how
// many of the read were repeats.
func sessionResults(t *testing.T, outs []winOutput) (byID map[string]winOutput, repeats int) {
	t.Helper()
	byID = make(map[string]winOutput, len(outs))
	for _, o := range outs {
		c := o.content()
		if prev, ok := byID[o.ID]; ok {
			repeats++
			if !reflect.DeepEqual(prev, c) {
				t.Errorf("output id %s stored twice with different content:\n  %+v\n  %+v", o.ID, prev, c)
			}
			continue
		}
		byID[o.ID] = c
	}
	return byID, repeats
}

// checkSessions compares the distinct outputs with the oracle: one session
// result per key sent to, revision 0, spanning the key's first event to its
// last plus the gap, with the oracle's count and sum; nothing for any other
// key.
func checkSessions(t *testing.T, byID map[string]winOutput, want map[string]*sessionExpect, when string) {
	t.Helper()
	perKey := map[string][]winOutput{}
	for _, o := range byID {
		perKey[o.Key] = append(perKey[o.Key], o)
	}
	var bad []string
	for _, k := range slices.Sorted(maps.Keys(perKey)) {
		if want[k] == nil {
			bad = append(bad, fmt.Sprintf("%s: never sent, but has outputs %v", k, ids(perKey[k])))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		w, got := want[k], perKey[k]
		if len(got) != 1 {
			bad = append(bad, fmt.Sprintf("%s: %d distinct outputs %v, want 1", k, len(got), ids(got)))
			continue
		}
		o := got[0]
		var v struct{ N, Spent *float64 }
		if err := json.Unmarshal(o.Values, &v); err != nil {
			bad = append(bad, fmt.Sprintf("%s: values %s: %v", k, o.Values, err))
			continue
		}
		var diffs []string
		check := func(what string, got, want any) {
			if !reflect.DeepEqual(got, want) {
				diffs = append(diffs, fmt.Sprintf("%s=%v want %v", what, got, want))
			}
		}
		check("pipeline", o.Pipeline, "visits")
		check("kind", o.Kind, "session")
		check("name", o.Name, "visit")
		check("revision", o.Revision, uint32(0))
		check("start", o.Start.UnixMilli(), w.first)
		check("end", o.End.UnixMilli(), w.last+sessionGap.Milliseconds())
		check("count", o.Count, uint64(w.n))
		check("values.n", deref(v.N), float64(w.n))
		check("values.spent", deref(v.Spent), float64(w.sum))
		if o.Watermark.Before(o.End) {
			diffs = append(diffs, fmt.Sprintf("watermark %v before the end", o.Watermark))
		}
		if len(diffs) > 0 {
			bad = append(bad, fmt.Sprintf("%s (%s): %s", k, o.ID, strings.Join(diffs, ", ")))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%s: %d keys wrong:\n  %s", when, len(bad), strings.Join(bad[:min(25, len(bad))], "\n  "))
	}
}

func ids(outs []winOutput) []string {
	s := make([]string, len(outs))
	for i, o := range outs {
		s[i] = o.ID
	}
	slices.Sort(s)
	return s
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// sendVisits posts events (all of which must be accepted as new) and adds
// them to the oracle.
func sendVisits(t *testing.T, n *node, name string, evs []visitJSON, want map[string]*sessionExpect) {
	t.Helper()
	body, err := json.Marshal(evs)
	if err != nil {
		t.Fatal(err)
	}
	b := &batch{name: name, pipeline: "visits", events: make([]event, len(evs)), body: body, contentType: "application/json"}
	if r := n.mustPost(b); r.Duplicates != 0 {
		t.Fatalf("batch %s: %+v, want every event new", name, r)
	}
	for _, e := range evs {
		x := want[e.User]
		if x == nil {
			x = &sessionExpect{first: e.TS, last: e.TS, group: actors.GroupOf(e.User, sessionGroups)}
			want[e.User] = x
		}
		x.n++
		x.sum += e.Amount
		x.first, x.last = min(x.first, e.TS), max(x.last, e.TS)
	}
}

// checkSessionOpen checks that the node shows key's session open, with
// what was sent (GET …/keys/{key}: watermark and windows).
func (n *node) checkSessionOpen(key string, want *sessionExpect) error {
	resp, err := n.client.Get(n.base + "/v1/pipelines/visits/keys/" + key)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var ks struct {
		Watermark *time.Time `json:"watermark"`
		Windows   []struct {
			Name, Kind string
			Start, End time.Time
			Count      uint64
			Emitted    uint32
		} `json:"windows"`
	}
	if err := json.Unmarshal(body, &ks); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET keys/%s: %d %q %v", key, resp.StatusCode, body, err)
	}
	// (The watermark is absent until the key first advanced, and the test
	// premises say nothing of it.)
	if len(ks.Windows) != 1 {
		return fmt.Errorf("GET keys/%s shows not one window (is the windows: entry of the config read?): %s", key, body)
	}
	w := ks.Windows[0]
	if w.Name != "visit" || w.Kind != "session" || w.Count != uint64(want.n) || w.Emitted != 0 ||
		w.Start.UnixMilli() != want.first || w.End.UnixMilli() != want.last+sessionGap.Milliseconds() || (ks.Watermark != nil && !ks.Watermark.Before(w.End)) {
		return fmt.Errorf("GET keys/%s: want an open session of %d events from %d to %d: %s", key, want.n, want.first, want.last+sessionGap.Milliseconds(), body)
	}
	return nil
}

// waitOutputs waits until the output log holds a result for every key of
// want, and returns the log.
func waitOutputs(t *testing.T, n *node, want map[string]*sessionExpect, timeout time.Duration) []winOutput {
	t.Helper()
	var outs []winOutput
	waitUntil(t, timeout, fmt.Sprintf("%s to store the sessions of %d keys", n.name, len(want)), func() (bool, error) {
		if n.hasExited() {
			return false, fmt.Errorf("%s exited (%v):\n%s", n.name, n.cmd.ProcessState, n.logs.tail(30))
		}
		var err error
		if outs, err = n.allOutputs("visits", 100); err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, o := range outs {
			seen[o.Key] = true
		}
		for k := range want {
			if !seen[k] {
				return false, nil
			}
		}
		return true, nil
	})
	return outs
}

// testSessionsSurviveKill opens sessions on many keys, checkpoints some and
// leaves the rest in the log tail, kills the node before any session
// closes, and checks that the restarted node emits every session exactly
// once without any further event for those keys; then kills it again and
// checks that a second restart emits nothing new.
func testSessionsSurviveKill(t *testing.T, storeArgs ...string) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	cfg := writeConfig(t, sessionsYAML)
	const keys = 200
	want := map[string]*sessionExpect{}

	n := startNode(t, "node-0", cfg, storeArgs...)
	t0 := time.Now()
	ckpt0, err := n.metric("keyfold_checkpoints_total")
	if err != nil {
		t.Fatal(err)
	}

	// Wave 1: every key opens a session of 1–4 events within 150 ms of
	// event time.
	base := time.Now().UnixMilli()
	var wave1 []visitJSON
	for k := range keys {
		for i := range 1 + rng.IntN(4) {
			wave1 = append(wave1, visitJSON{
				User: fmt.Sprintf("u%03d", k), ID: fmt.Sprintf("w1-%03d-%d", k, i),
				TS: base + rng.Int64N(150), Amount: 1 + rng.Int64N(100),
			})
		}
	}
	rng.Shuffle(len(wave1), func(i, j int) { wave1[i], wave1[j] = wave1[j], wave1[i] })
	sendVisits(t, n, "wave1", wave1, want)
	if err := n.checkSessionOpen("u000", want["u000"]); err != nil {
		t.Fatalf("test premise: %v", err)
	}
	groups1 := map[uint32]bool{}
	for _, x := range want {
		groups1[x.group] = true
	}

	// Every group wave 1 touched is checkpointed (nothing was dirty before
	// it, so each checkpoint counted since is one of its groups).
	before, _ := strconv.ParseFloat(ckpt0, 64)
	waitUntil(t, 10*time.Second, "a checkpoint of wave 1", func() (bool, error) {
		v, err := n.metric("keyfold_checkpoints_total")
		if err != nil {
			return false, err
		}
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f >= before+float64(len(groups1)), err
	})
	tCkpt := time.Now()
	if outs, err := n.allOutputs("visits", 100); err != nil || len(outs) != 0 {
		t.Fatalf("test premise: no session may close before the kill, but the log holds %d outputs (%v)", len(outs), err)
	}

	// Wave 2, right after that checkpoint (the next is about a second
	// away): half the keys extend their sessions with events 500 ms of event
	// time later. Then kill -9 at once: wave 2 is only in the log tail.
	var wave2 []visitJSON
	for k := keys / 2; k < keys; k++ {
		key := fmt.Sprintf("u%03d", k)
		for i := range 1 + rng.IntN(2) {
			wave2 = append(wave2, visitJSON{
				User: key, ID: fmt.Sprintf("w2-%03d-%d", k, i),
				TS: want[key].last + 500 + rng.Int64N(100), Amount: 1 + rng.Int64N(100),
			})
		}
	}
	sendVisits(t, n, "wave2", wave2, want)
	n.kill()
	tKill := time.Now()

	// Restart and send nothing more: the timers alone must close every
	// session.
	n = startNode(t, "node-1", cfg, storeArgs...)
	if r := n.recoveredRecords(); r == 0 {
		t.Errorf("node-1 replayed no records: wave 2 was checkpointed before the kill, so the log tail went untested")
	}
	outs := waitOutputs(t, n, want, 15*time.Second)
	tEmitted := time.Now()
	byID, repeats := sessionResults(t, outs)
	checkSessions(t, byID, want, "after the first restart")
	t.Logf("%d keys, %d events (%d after the checkpoint); restart replayed %d records; %d outputs stored, %d distinct, %d repeats; "+
		"wave 1 to its checkpoint %v, to the kill %v; kill to every session stored %v",
		len(want), len(wave1)+len(wave2), len(wave2), n.recoveredRecords(), len(outs), len(byID), repeats,
		tCkpt.Sub(t0).Round(time.Millisecond), tKill.Sub(t0).Round(time.Millisecond), tEmitted.Sub(tKill).Round(time.Millisecond))

	// Once every session was emitted: kill -9 again and restart. No new id
	// may appear. A sentinel key (none of the others) opened after the
	// restart closes seconds after any timer the restart could fire, so
	// once its session is stored, anything re-emitted is stored too.
	n.kill()
	n = startNode(t, "node-2", cfg, storeArgs...)
	sendVisits(t, n, "sentinel", []visitJSON{{User: "sentinel", ID: "s-0", TS: time.Now().UnixMilli(), Amount: 7}}, want)
	outs = waitOutputs(t, n, want, 15*time.Second)
	byID2, repeats2 := sessionResults(t, outs)
	checkSessions(t, byID2, want, "after the second restart")
	for id, o := range byID2 {
		if o.Key == "sentinel" {
			continue
		}
		if prev, ok := byID[id]; !ok {
			t.Errorf("new id %s after the second restart", id)
		} else if !reflect.DeepEqual(prev, o) {
			t.Errorf("id %s changed content after the second restart:\n  %+v\n  %+v", id, prev, o)
		}
	}
	t.Logf("second restart replayed %d records; %d outputs stored, %d distinct, %d repeats; %v since the first node was ready",
		n.recoveredRecords(), len(outs), len(byID2), repeats2, time.Since(t0).Round(time.Millisecond))
}

// TestSessionsSurviveKill: sessions open at a kill -9 are emitted after the
// restart, exactly once each, on the embedded store.
func TestSessionsSurviveKill(t *testing.T) {
	t.Parallel()
	testSessionsSurviveKill(t, "--data", t.TempDir())
}

// TestRedisSessionsSurviveKill is TestSessionsSurviveKill on Redis.
func TestRedisSessionsSurviveKill(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	testSessionsSurviveKill(t, "--redis", srv.URL())
}
