package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"testing"
	"time"

	_ "github.com/ncruces/go-sqlite3/driver" // the oracle's SQL engine
)

// The joins of TestJoinCrashOracle, all outer (every event that matched
// nothing is emitted alone): orders and payments with the same key match
// when payment.ts - order.ts is in [-2s, 2s] (paid), when in the same
// session of events each within 2s of the one before (sessions), and in
// each 2s window, starting every 500ms, that holds both (sliding).
const joinCrashYAML = `
pipelines:
  orders:   {key: k, time: ts, id: id, aggregates: {n: {op: count}}}
  payments: {key: k, time: ts, id: id, aggregates: {n: {op: count}}}
joins:
  paid:
    type: interval
    mode: outer
    left:  {pipeline: orders, fields: [v]}
    right: {pipeline: payments, fields: [v]}
    lower: -2s
    upper: 2s
    out_of_orderness: 1s
    allowed_lateness: 3s
    idle_timeout: 3s
  sessions:
    type: window
    window: session
    mode: outer
    gap: 2s
    left:  {pipeline: orders, fields: [v]}
    right: {pipeline: payments, fields: [v]}
    out_of_orderness: 1s
    allowed_lateness: 3s
    idle_timeout: 3s
  sliding:
    type: window
    window: sliding
    mode: outer
    size: 2s
    slide: 500ms
    left:  {pipeline: orders, fields: [v]}
    right: {pipeline: payments, fields: [v]}
    out_of_orderness: 1s
    allowed_lateness: 3s
    idle_timeout: 3s
`

// joinCrashPairs are, by join, the SQL of the pairs it matches, over the
// tables o (orders), p (payments), s (both, with each event's session sid)
// and n (0 to 3): key, order id and time, payment id and time, and the
// window's start (sliding; NULL for the others).
var joinCrashPairs = map[string]string{
	"paid": `SELECT o.k, o.id, o.ts, p.id, p.ts, NULL FROM o JOIN p ON o.k = p.k AND p.ts - o.ts BETWEEN -2000 AND 2000`,
	"sessions": `SELECT a.k, a.id, a.ts, b.id, b.ts, NULL FROM s a JOIN s b ON a.k = b.k AND a.sid = b.sid
		WHERE a.side = 'orders' AND b.side = 'payments'`,
	// The windows [ws, ws+2000), ws a multiple of 500, holding both: from
	// the last one starting at or before the earlier event, back.
	"sliding": `SELECT k, oid, ots, pid, pts, ws FROM (
		SELECT o.k AS k, o.id AS oid, o.ts AS ots, p.id AS pid, p.ts AS pts, (min(o.ts, p.ts) / 500 - n.i) * 500 AS ws
		FROM o JOIN p ON o.k = p.k CROSS JOIN n) WHERE ws > max(ots, pts) - 2000`,
}

type joinEv struct {
	side string
	key  string
	id   string
	ts   int64
	late bool // sent a minute behind the newest event: beyond allowed_lateness
}

// TestJoinCrashOracle: a seeded, out-of-order stream of two inputs over 300
// keys, with events behind the watermark but within allowed_lateness and
// events far beyond it, crosses a kill -9 of a real `keyfold serve`; the
// client resends every batch it has no answer for. The join's results,
// read from the output log, must equal the same join computed by SQLite
// over the acknowledged events that were not late: each match once, each
// event alone once, and never one that a match contradicts.
func TestJoinCrashOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 17))
	var events []joinEv
	ts := int64(1_800_000_000_000)
	for i := range 4000 {
		ts += rng.Int64N(20)
		e := joinEv{side: [2]string{"orders", "payments"}[rng.IntN(2)], key: fmt.Sprintf("k%d", rng.IntN(300)), id: fmt.Sprint("e", i), ts: ts}
		events = append(events, e)
	}
	// Out of order: delivered by time plus up to 2.5 s, so some events are
	// behind the watermark (out_of_orderness 1 s) but within the 3 s of
	// allowed_lateness.
	delivery := slices.Clone(events)
	jitter := map[string]int64{}
	for _, e := range delivery {
		jitter[e.id] = rng.Int64N(2500)
	}
	sort.SliceStable(delivery, func(i, j int) bool {
		return delivery[i].ts+jitter[delivery[i].id] < delivery[j].ts+jitter[delivery[j].id]
	})
	// Late ones: after the first tenth, now and then an event a minute
	// behind the newest sent.
	var stream []joinEv
	for i, e := range delivery {
		stream = append(stream, e)
		if i > len(delivery)/10 && rng.IntN(40) == 0 {
			l := joinEv{side: e.side, key: e.key, id: fmt.Sprint("late", i), ts: e.ts - 60_000, late: true}
			stream = append(stream, l)
		}
	}

	dir := t.TempDir()
	cfg := writeConfig(t, joinCrashYAML)
	n := startNode(t, "joins", cfg, "--data", dir)
	type jbatch struct {
		pipeline string
		events   []joinEv
		body     []byte
	}
	var batches []*jbatch
	for i := 0; i < len(stream); {
		size := min(1+rng.IntN(30), len(stream)-i)
		byPipeline := map[string]*jbatch{}
		for _, e := range stream[i : i+size] {
			b := byPipeline[e.side]
			if b == nil {
				b = &jbatch{pipeline: e.side}
				byPipeline[e.side] = b
				batches = append(batches, b)
			}
			b.events = append(b.events, e)
		}
		i += size
	}
	for _, b := range batches {
		docs := make([]map[string]any, len(b.events))
		for i, e := range b.events {
			docs[i] = map[string]any{"k": e.key, "id": e.id, "ts": e.ts, "v": e.id}
		}
		b.body, _ = json.Marshal(docs)
	}
	send := func(b *jbatch) error {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, n.base+"/v1/pipelines/"+b.pipeline+"/events", bytes.NewReader(b.body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		var r ingestReply
		_, err = doJSON(n.client, req, &r)
		return err
	}
	killAt := len(batches) / 2
	for i, b := range batches {
		if i == killAt {
			// Kill the node with a batch in flight: its outcome is unknown,
			// so the client sends it again to the restarted node (its ids
			// make that exact).
			sent := make(chan error, 1)
			go func() { sent <- send(b) }()
			n.kill()
			<-sent
			n = startNode(t, "joins-restarted", cfg, "--data", dir)
		}
		waitUntil(t, 60*time.Second, "batch accepted", func() (bool, error) {
			if n.hasExited() {
				return false, fmt.Errorf("%s exited:\n%s", n.name, n.logs.tail(30))
			}
			return send(b) == nil, nil
		})
	}
	if n.name != "joins-restarted" {
		t.Fatal("the node was never killed")
	}

	late := 0
	for _, e := range stream {
		if e.late {
			late++
		}
	}
	for _, join := range []string{"paid", "sessions", "sliding"} {
		got := joinCrashResults(t, n, join, sqliteJoin(t, join, events, stream))
		t.Logf("%s: %d results from %d events (%d of them late) over 300 keys, across a kill -9", join, len(got), len(stream), late)
	}
}

// joinCrashResults reads the join's results until there are as many as
// want has, and checks them against it: each id once, with one content.
func joinCrashResults(t *testing.T, n *node, join string, want map[string]bool) map[string]string {
	t.Helper()
	// Input goes idle: the join's watermark advances with processing time
	// after idle_timeout and every buffered event leaves.
	var got map[string]string
	waitUntil(t, 90*time.Second, "every result of "+join, func() (bool, error) {
		outs, err := n.allOutputs(join, 1000)
		if err != nil {
			return false, err
		}
		got = map[string]string{}
		for _, o := range outs {
			c, _ := json.Marshal(o.content())
			if prev, ok := got[o.ID]; ok && prev != string(c) {
				return false, fmt.Errorf("result %s stored twice with different contents:\n%s\n%s", o.ID, prev, c)
			}
			got[o.ID] = string(c)
		}
		return len(got) >= len(want), nil
	})
	for id := range want {
		if _, ok := got[id]; !ok {
			t.Errorf("missing result %s", id)
		}
	}
	for id, c := range got {
		if !want[id] {
			t.Errorf("unexpected result %s: %s", id, c)
		}
	}
	return got
}

// sqliteJoin computes the join's result ids with SQL over the events that
// were not late: matches (joinCrashPairs), then orders and payments that
// matched nothing. Ids are named as the README says: join/key/left/right,
// each side id@ms or empty, a sliding window's match with /start-end.
func sqliteJoin(t *testing.T, join string, events, stream []joinEv) map[string]bool {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+t.TempDir()+"/oracle.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := func(q string, args ...any) {
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE ev (side TEXT, k TEXT, id TEXT, ts INTEGER)`)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range stream {
		if !e.late {
			if _, err := tx.Exec(`INSERT INTO ev VALUES (?, ?, ?, ?)`, e.side, e.key, e.id, e.ts); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`
		WITH o AS (SELECT * FROM ev WHERE side = 'orders'), p AS (SELECT * FROM ev WHERE side = 'payments'),
		-- sessions: per key, by time, a new one after a gap of more than 2s
		s AS (SELECT *, SUM(brk) OVER (PARTITION BY k ORDER BY ts, side, id ROWS UNBOUNDED PRECEDING) AS sid FROM (
			SELECT *, CASE WHEN ts - LAG(ts) OVER (PARTITION BY k ORDER BY ts, side, id) > 2000 THEN 1 ELSE 0 END AS brk FROM ev)),
		n AS (SELECT 0 AS i UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3),
		m (k, oid, ots, pid, pts, ws) AS (` + joinCrashPairs[join] + `)
		SELECT k, oid, ots, pid, pts, ws FROM m
		UNION ALL SELECT k, id, ts, NULL, NULL, NULL FROM o WHERE id NOT IN (SELECT oid FROM m)
		UNION ALL SELECT k, NULL, NULL, id, ts, NULL FROM p WHERE id NOT IN (SELECT pid FROM m)`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[string]bool{}
	for rows.Next() {
		var k string
		var oid, pid sql.NullString
		var ots, pts, ws sql.NullInt64
		if err := rows.Scan(&k, &oid, &ots, &pid, &pts, &ws); err != nil {
			t.Fatal(err)
		}
		ref := func(id sql.NullString, ts sql.NullInt64) string {
			if !id.Valid {
				return ""
			}
			return fmt.Sprintf("%s@%d", url.PathEscape(id.String), ts.Int64)
		}
		id := join + "/" + url.PathEscape(k) + "/" + ref(oid, ots) + "/" + ref(pid, pts)
		if ws.Valid {
			id += fmt.Sprintf("/%d-%d", ws.Int64, ws.Int64+2000)
		}
		want[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || len(events) == 0 {
		t.Fatal("the oracle found nothing")
	}
	return want
}
