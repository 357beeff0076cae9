package keyfold_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/keyfold/keyfold"
)

func ExampleParseConfig() {
	cfg, err := keyfold.ParseConfig([]byte(`
http: 127.0.0.1:8080
pipelines:
  logins:
    key: user_id
    id: event_id
    dedup_window: 1h
    aggregates:
      failed: {op: count, where: "type == 'login_failed'"}
      amount: {op: sum, field: amount}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	p := cfg.Pipelines["logins"]
	fmt.Println("http:", cfg.HTTPAddr)
	fmt.Println("logins keyed by", p.Key, "deduplicated by", p.ID, "for", p.DedupWindow)
	names := make([]string, 0, len(p.Aggregates))
	for name := range p.Aggregates {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		a := p.Aggregates[name]
		fmt.Printf("  %s: %+v\n", name, a)
	}
	// Output:
	// http: 127.0.0.1:8080
	// logins keyed by user_id deduplicated by event_id for 1h0m0s
	//   amount: {Op:sum Field:amount Where:}
	//   failed: {Op:count Field: Where:type == 'login_failed'}
}

// Every problem is reported at once, naming the pipeline and the entry.
func ExampleParseConfig_errors() {
	_, err := keyfold.ParseConfig([]byte(`
pipelines:
  logins:
    aggregates:
      amount: {op: sum}
      avg:    {op: average, field: amount}
`))
	fmt.Println(err)
	// Output:
	// keyfold: config: pipeline "logins": key (line 3): is required (the field that names each key)
	// keyfold: config: pipeline "logins": aggregates.amount (line 5): op sum needs a field
	// keyfold: config: pipeline "logins": aggregates.avg (line 6): unknown op "average" (want one of count, distinct, last, max, min, quantiles, sum)
}

// Example embeds a node in a Go program: no HTTP, state in a directory of
// its own, events in and one key's state out.
func Example() {
	dir, err := os.MkdirTemp("", "keyfold-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	node, err := keyfold.New(keyfold.Config{
		DataDir: dir,
		Pipelines: map[string]keyfold.PipelineConfig{
			"logins": {
				Key: "user_id",
				ID:  "event_id",
				Aggregates: map[string]keyfold.AggregateConfig{
					"failed": {Op: "count", Where: "type == 'login_failed'"},
					"amount": {Op: "sum", Field: "amount"},
				},
			},
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx) }()
	<-node.Ready()

	res, err := node.Ingest(ctx, "logins", []json.RawMessage{
		json.RawMessage(`{"user_id": "alice", "event_id": "1", "type": "login_failed", "amount": 3}`),
		json.RawMessage(`{"user_id": "alice", "event_id": "2", "type": "login_ok", "amount": 4}`),
		json.RawMessage(`{"user_id": "alice", "event_id": "1", "type": "login_failed", "amount": 3}`), // a retry
	})
	fmt.Printf("accepted %d, duplicates %d, err %v\n", res.Accepted, res.Duplicates, err)

	st, err := node.Query(ctx, "logins", "alice")
	fmt.Println(st.Seq, st.Aggregates["failed"], st.Aggregates["amount"], err)

	_, err = node.Query(ctx, "logins", "bob")
	fmt.Println(errors.Is(err, keyfold.ErrNotFound))

	node.Close()
	fmt.Println(<-done)
	// Output:
	// accepted 2, duplicates 1, err <nil>
	// 2 1 7 <nil>
	// true
	// <nil>
}
