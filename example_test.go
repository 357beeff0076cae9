package keyfold_test

import (
	"fmt"
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
	// pipeline "logins": key: is required (the field that names each key)
	// pipeline "logins": aggregates.amount: op sum needs a field
	// pipeline "logins": aggregates.avg: unknown op "average" (want one of count, last, max, min, sum)
}
