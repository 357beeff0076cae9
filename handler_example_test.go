package keyfold_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/keyfold/keyfold"
)

// payment is the state of one payment: what the rule remembers of it.
type payment struct {
	Amount  float64   `json:"amount"`
	Created time.Time `json:"created"`
}

// unconfirmed alerts on payments created and not confirmed within 10
// minutes of event time.
type unconfirmed struct{}

func (unconfirmed) OnEvent(k *keyfold.Key[payment], ev keyfold.Event) error {
	var e struct {
		Type   string  `json:"type"`
		Amount float64 `json:"amount"`
	}
	if err := ev.Decode(&e); err != nil {
		return err
	}
	switch e.Type {
	case "created":
		k.Set(payment{Amount: e.Amount, Created: ev.Time})
		return k.SetTimer("confirm", ev.Time.Add(10*time.Minute))
	case "confirmed":
		k.CancelTimer("confirm")
		k.Delete() // done with it: the key's state is gone
	}
	return nil
}

func (unconfirmed) OnTimer(k *keyfold.Key[payment], t keyfold.Timer) error {
	p := k.State()
	if err := k.Emit("unconfirmed", map[string]any{"amount": p.Amount, "created": p.Created, "deadline": t.Time}); err != nil {
		return err
	}
	k.Delete()
	return nil
}

// A "payment not confirmed within 10 minutes" rule: a Go handler with an
// event-time timer per payment. The timer fires once the pipeline's
// watermark passes the deadline, here moved by a later payment's event
// (and, with no events at all, by the clock after idle_timeout), even if
// the payment's key is quiet, passivated, or the node restarted.
func ExampleHandle() {
	cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{
		"payments": {Key: "payment", ID: "event_id", Time: "at"},
	}}
	if err := keyfold.Handle(&cfg, "payments", unconfirmed{}); err != nil {
		panic(err)
	}
	node, stop := exampleNode(cfg) // New, Run, Ready (see Example)
	ctx := context.Background()

	_, err := node.Ingest(ctx, "payments", []json.RawMessage{
		json.RawMessage(`{"payment": "p1", "event_id": "1", "type": "created", "amount": 30, "at": "2026-12-01T10:00:00Z"}`),
		json.RawMessage(`{"payment": "p2", "event_id": "2", "type": "created", "amount": 99, "at": "2026-12-01T10:01:00Z"}`),
		json.RawMessage(`{"payment": "p1", "event_id": "3", "type": "confirmed", "at": "2026-12-01T10:04:00Z"}`),
		json.RawMessage(`{"payment": "p3", "event_id": "4", "type": "created", "amount": 5, "at": "2026-12-01T10:12:00Z"}`),
	})
	fmt.Println("ingested:", err)
	st, err := node.Query(ctx, "payments", "p3")
	fmt.Println("p3:", string(st.State), err)

	// The watermark passed p2's deadline: its alert is emitted and stored.
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	errFound := errors.New("found")
	err = node.Subscribe(wait, "payments", "", func(o keyfold.Output) error {
		fmt.Println(o.Kind, o.Name, o.Key, string(o.Values))
		return errFound
	})
	cancel()
	fmt.Println(errors.Is(err, errFound))

	fmt.Println(stop())
	// Output:
	// ingested: <nil>
	// p3: {"amount":5,"created":"2026-12-01T10:12:00Z"} <nil>
	// handler unconfirmed p2 {"amount":99,"created":"2026-12-01T10:01:00Z","deadline":"2026-12-01T10:11:00Z"}
	// true
	// <nil>
}

// quota is a rate limiter's state per API key: requests in the current
// minute of event time.
type quota struct {
	Minute time.Time `json:"minute"`
	Used   int       `json:"used"`
}

// A rate limiter per API key, 3 requests a minute: requests beyond it are
// emitted as "throttled"; a timer at the end of the minute drops the
// key's state, so idle keys cost nothing. HandlerFuncs builds the handler
// from two functions.
func ExampleHandlerFuncs() {
	const limit = 3
	limiter := keyfold.HandlerFuncs[quota]{
		Event: func(k *keyfold.Key[quota], ev keyfold.Event) error {
			q := k.State()
			if minute := ev.Time.Truncate(time.Minute); !q.Minute.Equal(minute) {
				q = quota{Minute: minute}
				if err := k.SetTimer("reset", minute.Add(time.Minute)); err != nil {
					return err
				}
			}
			q.Used++
			k.Set(q)
			if q.Used > limit {
				return k.Emit("throttled", map[string]any{"request": ev.ID, "used": q.Used})
			}
			return nil
		},
		Timer: func(k *keyfold.Key[quota], t keyfold.Timer) error {
			k.Delete()
			return nil
		},
	}
	cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{
		"requests": {Key: "api_key", ID: "request", Time: "at", Aggregates: map[string]keyfold.AggregateConfig{"requests": {Op: "count"}}},
	}}
	if err := keyfold.Handle(&cfg, "requests", limiter); err != nil {
		panic(err)
	}
	node, stop := exampleNode(cfg)
	ctx := context.Background()

	var batch []json.RawMessage
	for i, at := range []string{"10:00:01", "10:00:10", "10:00:20", "10:00:30", "10:00:40", "10:01:05"} {
		batch = append(batch, json.RawMessage(fmt.Sprintf(`{"api_key": "k1", "request": "r%d", "at": "2026-12-01T%sZ"}`, i+1, at)))
	}
	_, err := node.Ingest(ctx, "requests", batch)
	fmt.Println("ingested:", err)
	st, err := node.Query(ctx, "requests", "k1")
	fmt.Println("k1:", st.Aggregates["requests"], string(st.State), err)

	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	n := 0
	errDone := errors.New("done")
	err = node.Subscribe(wait, "requests", "", func(o keyfold.Output) error {
		fmt.Println(o.Name, string(o.Values))
		if n++; n == 2 {
			return errDone
		}
		return nil
	})
	cancel()
	fmt.Println(errors.Is(err, errDone))

	fmt.Println(stop())
	// Output:
	// ingested: <nil>
	// k1: 6 {"minute":"2026-12-01T10:01:00Z","used":1} <nil>
	// throttled {"request":"r4","used":4}
	// throttled {"request":"r5","used":5}
	// true
	// <nil>
}

// exampleNode runs a node on cfg with its state in a temporary directory,
// as Example does; stop closes it, removes the directory and returns
// Run's error.
func exampleNode(cfg keyfold.Config) (*keyfold.Node, func() error) {
	dir, err := os.MkdirTemp("", "keyfold-example")
	if err != nil {
		panic(err)
	}
	cfg.DataDir = dir
	node, err := keyfold.New(cfg)
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- node.Run(context.Background()) }()
	<-node.Ready()
	return node, func() error {
		node.Close()
		err := <-done
		os.RemoveAll(dir)
		return err
	}
}

// window is the state of a rate limiter's key: the calls counted in the
// current window.
type window struct {
	Used int `json:"used"`
}

// A rate limiter per API key, as a call: each request asks "may I?" and
// the key answers, at most 3 a window of 2 s of the node's clock. The
// window starts with the key's first request and ends with a
// processing-time timer, which reports the window and deletes the key: a
// key without requests costs nothing. The call carries an id, so a client
// that retries a request it got no answer for is not counted twice.
func ExampleKey_SetProcessingTimer() {
	const limit, span = 3, 2 * time.Second
	limiter := keyfold.HandlerFuncs[window]{
		Call: func(k *keyfold.Key[window], req keyfold.Request) (any, error) {
			w := k.State()
			if !k.Exists() {
				if err := k.SetProcessingTimer("reset", k.Now().Add(span)); err != nil {
					return nil, err
				}
			}
			w.Used++
			k.Set(w)
			return map[string]any{"allowed": w.Used <= limit, "used": w.Used}, nil
		},
		Timer: func(k *keyfold.Key[window], t keyfold.Timer) error {
			if err := k.Emit("window", map[string]any{"used": k.State().Used, "processing": t.Processing}); err != nil {
				return err
			}
			k.Delete()
			return nil
		},
	}
	cfg := keyfold.Config{Pipelines: map[string]keyfold.PipelineConfig{"limits": {Key: "api_key"}}}
	if err := keyfold.Handle(&cfg, "limits", limiter); err != nil {
		panic(err)
	}
	node, stop := exampleNode(cfg)
	ctx := context.Background()

	ask := func(id string) {
		r, err := node.Call(ctx, "limits", "k1", json.RawMessage(`{}`), keyfold.CallOptions{ID: id})
		fmt.Println(id, string(r.Reply), r.Duplicate, err)
	}
	for _, id := range []string{"r1", "r2", "r2", "r3", "r4", "r5"} { // r2 twice: a retry
		ask(id)
	}
	// The window ends by the clock: its timer reports it and deletes the
	// key, with no further input.
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	errDone := errors.New("done")
	err := node.Subscribe(wait, "limits", "", func(o keyfold.Output) error {
		fmt.Println(o.Name, string(o.Values))
		return errDone
	})
	cancel()
	fmt.Println(errors.Is(err, errDone))
	ask("r6") // a new window

	fmt.Println(stop())
	// Output:
	// r1 {"allowed":true,"used":1} false <nil>
	// r2 {"allowed":true,"used":2} false <nil>
	// r2 {"allowed":true,"used":2} true <nil>
	// r3 {"allowed":true,"used":3} false <nil>
	// r4 {"allowed":false,"used":4} false <nil>
	// r5 {"allowed":false,"used":5} false <nil>
	// window {"processing":true,"used":5}
	// true
	// r6 {"allowed":true,"used":1} false <nil>
	// <nil>
}
