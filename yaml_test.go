package keyfold

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
)

// A valid pipeline to pad configurations whose problems are elsewhere.
const okPipeline = `
  ok:
    key: user_id
    aggregates:
      n: {op: count}
`

// TestParseConfigRejects checks that each problem is reported, that its
// message names where it is (the pipeline and the entry) and what is wrong,
// and that every problem of a configuration is reported at once.
func TestParseConfigRejects(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		// Every problem, each as the substrings one line of the error must
		// hold, in any order.
		want [][]string
		// A known bug (see the report) that keeps the test from passing: it
		// is skipped while the bug is there and fails once it is fixed, so
		// the marker gets removed.
	}{
		{
			name: "unknown top-level key",
			yaml: "pipelnes:\n  logins: {key: user_id}\n",
			want: [][]string{{"config (line 1)", `unknown key "pipelnes"`, "known: ", "pipelines"}},
		},
		{
			name: "unknown pipeline key",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    agregates: {}\n",
			want: [][]string{{`pipeline "logins"`, "(line 4)", `unknown key "agregates"`, "aggregates, allowed_lateness, dedup_window, id, idle_timeout, key, out_of_orderness, output_retention, patterns, time, ttl, windows"}},
		},
		{
			name: "unknown aggregate key",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      amount: {op: sum, fild: amount}\n",
			want: [][]string{{`pipeline "logins": aggregates.amount`, "(line 5)", `unknown key "fild"`, "field, op, where"}},
		},
		{
			name: "unknown op",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      avg: {op: average, field: amount}\n",
			want: [][]string{{`pipeline "logins": aggregates.avg`, `unknown op "average"`, "count, distinct, last, max, min, quantiles, sum"}},
		},
		{
			name: "missing op",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      amount: {field: amount}\n",
			want: [][]string{{`pipeline "logins": aggregates.amount`, "op is required"}},
		},
		{
			name: "sum without field",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      amount: {op: sum}\n",
			want: [][]string{{`pipeline "logins": aggregates.amount`, "op sum needs a field"}},
		},
		{
			name: "where that does not compile",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      failed: {op: count, where: \"type ==\"}\n",
			want: [][]string{{`pipeline "logins": aggregates.failed`, `where "type ==" does not compile`}},
		},
		{
			name: "where with now()",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      recent: {op: count, where: \"now() > ts\"}\n",
			want: [][]string{{`pipeline "logins": aggregates.recent`, "now() is not allowed"}},
		},
		{
			name: "missing key",
			yaml: "pipelines:\n  logins:\n    aggregates:\n      n: {op: count}\n",
			want: [][]string{{`pipeline "logins": key`, "is required"}},
		},
		{
			name: "negative dedup window",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    dedup_window: -1h\n",
			want: [][]string{{`pipeline "logins": dedup_window`, "must be at least 1ms"}},
		},
		{
			name: "no pipelines",
			yaml: "http: 127.0.0.1:8080\n",
			want: [][]string{{"no pipelines"}},
		},
		{
			name: "pipelines as a list",
			yaml: "pipelines:\n  - logins\n  - purchases\n",
			want: [][]string{{"config (line 2)", "pipelines: want a mapping, got a list"}},
		},
		{
			name: "pipeline as a scalar",
			yaml: "pipelines:\n  logins: user_id\n",
			want: [][]string{{`pipeline "logins" (line 2)`, `want a mapping, got "user_id"`}},
		},
		{
			name: "empty pipeline",
			yaml: "pipelines:\n  logins:\n",
			want: [][]string{{`pipeline "logins" (line 2)`, "want a mapping"}},
		},
		{
			name: "aggregates as a list",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      - {op: count}\n",
			want: [][]string{{`pipeline "logins" (line 5)`, "aggregates: want a mapping, got a list"}},
		},
		{
			name: "aggregate as a scalar",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      n: count\n",
			want: [][]string{{`pipeline "logins": aggregates.n (line 5)`, `want a mapping, got "count"`}},
		},
		{
			name: "wrong scalar types",
			yaml: "key_groups: many\nmax_body_bytes: [1]\nidle_timeout: 10\npipelines:\n  logins:\n    key: [user_id]\n    dedup_window: soon\n    aggregates:\n      n: {op: {name: count}}\n",
			want: [][]string{
				{"config (line 1)", "key_groups", "`many`", "uint32"},
				{"config (line 2)", "max_body_bytes", "int64"},
				{"config (line 3)", "idle_timeout", "`10`", "time.Duration"},
				{`pipeline "logins" (line 6)`, "key", "!!seq", "string"},
				{`pipeline "logins" (line 7)`, "dedup_window", "soon"},
				{`pipeline "logins": aggregates.n (line 9)`, "op", "!!map", "string"},
			},
		},
		{
			name: "negative numbers and bad addresses",
			yaml: "http: localhost\ngrpc: \":x:y\"\ncheckpoint_interval: -1s\ncheckpoint_bytes: -1\nidle_timeout: -1m\nmax_active_keys: -1\nmax_memory: -1\nmax_body_bytes: -1\nshutdown_timeout: -5s\npipelines:" + okPipeline,
			want: [][]string{
				{`http address "localhost"`},
				{`grpc address ":x:y"`},
				{"checkpoint_interval must not be negative"},
				{"checkpoint_bytes must not be negative"},
				{"idle_timeout must not be negative"},
				{"max_active_keys must not be negative"},
				{"max_memory must not be negative"},
				{"max_body_bytes must not be negative"},
				{"shutdown_timeout must not be negative"},
			},
		},
		{
			name: "key_groups out of range",
			yaml: "key_groups: -1\npipelines:" + okPipeline,
			want: [][]string{{"config (line 1)", "key_groups", "`-1`", "uint32"}},
		},
		{
			name: "empty document",
			yaml: "# nothing here\n",
			want: [][]string{{"empty document"}},
		},
		{
			name: "not YAML",
			yaml: "pipelines: {{{\n",
			want: [][]string{{"keyfold: config: yaml:"}},
		},
		{
			name: "a list, not a mapping",
			yaml: "- pipelines\n",
			want: [][]string{{"config (line 1)", "want a mapping, got a list"}},
		},
		{
			name: "structural and validation problems of one pipeline at once",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    bogus: 1\n    aggregates:\n      a: {op: avg, field: x}\n      b: {op: sum}\n",
			want: [][]string{
				{`pipeline "logins" (line 4)`, `unknown key "bogus"`},
				{`pipeline "logins": aggregates.a`, `unknown op "avg"`},
				{`pipeline "logins": aggregates.b`, "op sum needs a field"},
			},
		},
		{
			name: "every structural problem at once",
			yaml: "bogus: 1\npipelines:\n  logins:\n    key: user_id\n    tim: ts\n    aggregates:\n      amount: {op: sum, field: amount, wher: x}\n  purchases:\n    kee: user_id\n    aggregates: [1]\n",
			want: [][]string{
				{"config (line 1)", `unknown key "bogus"`},
				{`pipeline "logins" (line 5)`, `unknown key "tim"`},
				{`pipeline "logins": aggregates.amount (line 7)`, `unknown key "wher"`},
				{`pipeline "purchases" (line 9)`, `unknown key "kee"`},
				{`pipeline "purchases" (line 10)`, "aggregates: want a mapping, got a list"},
			},
		},
		{
			name: "every pipeline problem at once",
			yaml: `pipelines:
  logins:
    key: user_id
    aggregates:
      avg:    {op: average, field: amount}
      amount: {op: sum}
      failed: {op: count, where: "type =="}
  purchases:
    dedup_window: -1s
    aggregates:
      biggest: {op: max}
` + okPipeline,
			want: [][]string{
				{`pipeline "logins": aggregates.avg`, `unknown op "average"`},
				{`pipeline "logins": aggregates.amount`, "op sum needs a field"},
				{`pipeline "logins": aggregates.failed`, "does not compile"},
				{`pipeline "purchases": key`, "is required"},
				{`pipeline "purchases": dedup_window`, "must be at least 1ms"},
				{`pipeline "purchases": aggregates.biggest`, "op max needs a field"},
			},
		},
		{
			name: "structural and pipeline problems at once",
			yaml: "http: localhost\npipelines:\n  logins:\n    key: user_id\n    bogus: 1\n  purchases:\n    aggregates:\n      avg: {op: average}\n",
			want: [][]string{
				{`pipeline "logins" (line 5)`, `unknown key "bogus"`},
				{`http address "localhost"`},
				{`pipeline "purchases": key`, "is required"},
				{`pipeline "purchases": aggregates.avg`, `unknown op "average"`},
			},
		},
		{
			name: "duplicate aggregate",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      n: {op: count}\n      n: {op: sum, field: amount}\n",
			want: [][]string{{`pipeline "logins": aggregates`, `"n"`}},
		},
		{
			name: "duplicate pipeline",
			yaml: "pipelines:\n  logins:\n    key: user_id\n  logins:\n    key: account_id\n",
			want: [][]string{{`"logins"`}},
		},
		{
			name: "duplicate top-level key",
			yaml: "http: 127.0.0.1:1\nhttp: 127.0.0.1:2\npipelines:" + okPipeline,
			want: [][]string{{`"http"`}},
		},
		{
			name: "dedup window under a millisecond",
			yaml: "pipelines:\n  logins:\n    key: user_id\n    id: event_id\n    dedup_window: 500us\n",
			want: [][]string{{`pipeline "logins": dedup_window`}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			problems := checkProblems(err, tc.want)
			for _, p := range problems {
				t.Error(p)
			}
			if err != nil && c.Pipelines != nil {
				t.Errorf("ParseConfig returned pipelines with its error: %+v", c.Pipelines)
			}
		})
	}
}

// checkProblems describes how err differs from want: one line of err's
// text for each problem (each holding all its substrings), and no other.
func checkProblems(err error, want [][]string) []string {
	if err == nil {
		return []string{"ParseConfig accepted the configuration"}
	}
	lines := problemLines(err)
	used := make([]bool, len(lines))
	var out []string
next:
	for _, subs := range want {
		for i, l := range lines {
			if !used[i] && containsAll(l, subs) {
				used[i] = true
				continue next
			}
		}
		out = append(out, "no problem reported with all of "+strings.Join(quoteAll(subs), ", ")+" in:\n"+err.Error())
	}
	for i, l := range lines {
		if !used[i] {
			out = append(out, "unexpected problem: "+l)
		}
	}
	return out
}

// problemLines splits a (joined) error into one string per problem; a
// problem's message may run on several lines (expr's compile errors do).
func problemLines(err error) []string {
	var errs []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		errs = append(errs, e)
	}
	walk(err)
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = "«" + s + "»"
	}
	return out
}

// Compile errors keep their type through ParseConfig, so a tool can point at
// the entry.
func TestParseConfigSpecErrors(t *testing.T) {
	_, err := ParseConfig([]byte("pipelines:\n  logins:\n    key: user_id\n    aggregates:\n      amount: {op: sum}\n"))
	var se *fold.SpecError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) holds no *fold.SpecError", err, err)
	}
	if se.Pipeline != "logins" || se.Entry != "aggregates.amount" || !strings.Contains(se.Problem, "needs a field") {
		t.Errorf("SpecError = %+v", *se)
	}
}

func TestParseConfigDurations(t *testing.T) {
	c, err := ParseConfig([]byte(`
checkpoint_interval: 250ms
idle_timeout: 1h30m
shutdown_timeout: 2s
pipelines:
  logins:
    key: user_id
    id: event_id
    dedup_window: 24h
  purchases:
    key: user_id
    id: order_id
    dedup_window: 168h
  views:
    key: user_id
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		name      string
		got, want time.Duration
	}{
		{"checkpoint_interval", c.CheckpointInterval, 250 * time.Millisecond},
		{"idle_timeout", c.IdleTimeout, 90 * time.Minute},
		{"shutdown_timeout", c.ShutdownTimeout, 2 * time.Second},
		{"logins.dedup_window", c.Pipelines["logins"].DedupWindow, 24 * time.Hour},
		{"purchases.dedup_window", c.Pipelines["purchases"].DedupWindow, 7 * 24 * time.Hour},
		{"views.dedup_window (unset)", c.Pipelines["views"].DedupWindow, 0},
	} {
		if d.got != d.want {
			t.Errorf("%s = %v, want %v", d.name, d.got, d.want)
		}
	}
	// An unset window compiles to the default.
	p, err := fold.Compile("views", c.Pipelines["views"])
	if err != nil {
		t.Fatal(err)
	}
	if p.DedupWindow() != fold.DefaultDedupWindow {
		t.Errorf("default dedup window = %v, want %v", p.DedupWindow(), fold.DefaultDedupWindow)
	}
}

func TestParseConfigFields(t *testing.T) {
	c, err := ParseConfig([]byte(`
data_dir: /var/lib/keyfold
http: 127.0.0.1:8080
grpc: "[::1]:9090"
key_groups: 64
max_active_keys: 5000
max_body_bytes: 1048576
pipelines:
  logins:
    key: user.id
    time: ts
    id: event_id
    aggregates:
      failed: {op: count, where: "type == 'login_failed'"}
      country: {op: last, field: geo.country}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		DataDir: "/var/lib/keyfold", HTTPAddr: "127.0.0.1:8080", GRPCAddr: "[::1]:9090",
		KeyGroups: 64, MaxActiveKeys: 5000, MaxBodyBytes: 1 << 20,
		Pipelines: map[string]PipelineConfig{"logins": {
			Key: "user.id", Time: "ts", ID: "event_id",
			Aggregates: map[string]AggregateConfig{
				"failed":  {Op: "count", Where: "type == 'login_failed'"},
				"country": {Op: "last", Field: "geo.country"},
			},
		}},
	}
	if !configEqual(c, want) {
		t.Errorf("ParseConfig =\n%+v\nwant\n%+v", c, want)
	}
}

func TestParseClusterSettings(t *testing.T) {
	c, err := ParseConfig([]byte(`
redis: redis://redis:6379
cluster: prod
advertise: node-1:9090
peers: [node-1:9090, node-2:9090]
cluster_lease: 2s
grpc: 0.0.0.0:9090
pipelines:
  p: { key: k }
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster != "prod" || c.Advertise != "node-1:9090" || !slices.Equal(c.Peers, []string{"node-1:9090", "node-2:9090"}) || c.ClusterLease != 2*time.Second {
		t.Fatalf("cluster settings: %q %q %v %v", c.Cluster, c.Advertise, c.Peers, c.ClusterLease)
	}
}
