package keyfold

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
)

func configEqual(a, b Config) bool { return reflect.DeepEqual(a, b) }

func TestLoadConfigQuickstart(t *testing.T) {
	c, err := LoadConfig("examples/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]PipelineConfig{"logins": {
		Key: "user_id", Time: "ts", ID: "event_id", DedupWindow: 24 * time.Hour,
		Aggregates: map[string]AggregateConfig{
			"total":    {Op: "count"},
			"failed":   {Op: "count", Where: "type == 'login_failed'"},
			"amount":   {Op: "sum", Field: "amount"},
			"biggest":  {Op: "max", Field: "amount"},
			"smallest": {Op: "min", Field: "amount"},
			"country":  {Op: "last", Field: "geo.country"},

			"countries": {Op: "distinct", Field: "geo.country"},
			"amounts":   {Op: "quantiles", Field: "amount"},
		},
	}}
	if !reflect.DeepEqual(c.Pipelines, want) {
		t.Errorf("quickstart pipelines =\n%+v\nwant\n%+v", c.Pipelines, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// Every example configuration loads.
func TestLoadConfigExamples(t *testing.T) {
	paths, err := filepath.Glob("examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no examples/*.yaml")
	}
	for _, path := range paths {
		if _, err := LoadConfig(path); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func TestLoadConfigErrors(t *testing.T) {
	dir := t.TempDir()

	missing := filepath.Join(dir, "missing.yaml")
	_, err := LoadConfig(missing)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LoadConfig(missing) = %v, want an error wrapping fs.ErrNotExist", err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("pipelines:\n  logins:\n    kye: user_id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadConfig(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": ") || !strings.Contains(err.Error(), `unknown key "kye"`) {
		t.Errorf("LoadConfig(bad) = %v, want the path, then the problem", err)
	}
}

// Validate checks a Config built in Go (no YAML), reporting every problem.
func TestValidate(t *testing.T) {
	good := map[string]PipelineConfig{"logins": {Key: "user_id", Aggregates: map[string]AggregateConfig{"n": {Op: "count"}}}}
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings, one per problem
	}{
		{"valid", Config{Pipelines: good}, nil},
		{"valid with addresses", Config{Pipelines: good, HTTPAddr: "127.0.0.1:0", GRPCAddr: ":9090"}, nil},
		{"no pipelines", Config{}, []string{"no pipelines"}},
		{"valid cluster", Config{Pipelines: good, Redis: "redis://127.0.0.1:6379", Cluster: "c", GRPCAddr: "127.0.0.1:9090"}, nil},
		{"valid cluster, advertised", Config{Pipelines: good, Redis: "redis://127.0.0.1:6379", Cluster: "c", GRPCAddr: ":9090",
			Advertise: "node-1.internal:9090", Peers: []string{"node-1.internal:9090", "node-2.internal:9090"}, ClusterLease: time.Second}, nil},
		{"cluster settings without a cluster", Config{Pipelines: good, Advertise: "a:1"}, []string{"advertise, peers and cluster_lease need cluster"}},
		{"cluster without a shared store or a reachable address", Config{Pipelines: good, Cluster: "c{1}", GRPCAddr: "0.0.0.0:9090",
			Peers: []string{"h"}, ClusterLease: time.Millisecond}, []string{
			`cluster name "c{1}" must not contain braces`,
			"a cluster needs a store its members share: set redis",
			`grpc listens on "0.0.0.0:9090": set advertise`,
			`peers: address h: missing port`,
			"cluster_lease 1ms is below 300ms",
		}},
		{"ingest limits", Config{Pipelines: good, MaxBodyBytes: 1 << 20, MaxBatchEvents: 1000, MaxIngestBytes: 1 << 20,
			AllowedOrigins: []string{"https://app.example", "*", "localhost:3000", "http://a/"}}, []string{
			"max_ingest_bytes 1048576 is less than max_body_bytes + max_batch_events × 384 = 1432576",
			`allowed_origins: "localhost:3000" is not an origin`,
			`allowed_origins: "http://a/" is not an origin`,
		}},
		{"negative ingest limits", Config{Pipelines: good, MaxIngestBytes: -1, MaxBatchEvents: -1}, []string{
			"max_ingest_bytes must not be negative", "max_batch_events must not be negative",
		}},
		// cache_memory is checked against the max_memory in effect: the
		// default when unset (it said "more than max_memory 0").
		{"cache within the default max_memory", Config{Pipelines: good, CacheMemory: 64 << 20}, nil},
		{"cache beyond the default max_memory", Config{Pipelines: good, CacheMemory: 2 << 30}, []string{
			"cache_memory 2147483648 is more than max_memory 1073741824, of which it is a part",
		}},
		// checkpoint_max_bytes is checked against a checkpoint_bytes set;
		// set alone below the default start, it is the start too
		// (actors.CheckpointBounds).
		{"checkpoints wait up to a bound", Config{Pipelines: good, CheckpointBytes: 1 << 20, CheckpointMaxBytes: 1 << 20}, nil},
		{"checkpoint bound below the start", Config{Pipelines: good, CheckpointBytes: 64 << 20, CheckpointMaxBytes: 32 << 20}, []string{
			"checkpoint_max_bytes 33554432 is less than checkpoint_bytes 67108864",
		}},
		{"checkpoint bound alone below the default start", Config{Pipelines: good, CheckpointMaxBytes: 32 << 20}, nil},
		{"huge pages on and off", Config{Pipelines: good, HugePages: "off"}, nil},
		{"huge pages misspelt", Config{Pipelines: good, HugePages: "true"}, []string{`huge_pages "true": want on or off`}},
		{"mapped reads misspelt", Config{Pipelines: good, StoreMappedReads: "false"}, []string{`store_mapped_reads "false": want on or off`}},
		{"cluster without grpc", Config{Pipelines: good, Redis: "redis://127.0.0.1:6379", Cluster: "c", Advertise: "h:1"},
			[]string{"a cluster member needs a gRPC address"}},
		{"everything wrong", Config{
			HTTPAddr:           "127.0.0.1",
			GRPCAddr:           "no-port",
			CheckpointInterval: -time.Second,
			IdleTimeout:        -time.Second,
			MaxActiveKeys:      -1,
			MaxBodyBytes:       -1,
			StoreCacheMemory:   -1,
			ShutdownTimeout:    -time.Second,
			Pipelines: map[string]PipelineConfig{
				"a":       {Aggregates: map[string]AggregateConfig{"s": {Op: "sum"}}},
				"b":       {Key: "k", Aggregates: map[string]AggregateConfig{"x": {Op: "median", Field: "v"}}},
				"c d":     {Key: "k"},
				"valid":   {Key: "k"},
				"filters": {Key: "k", Aggregates: map[string]AggregateConfig{"w": {Op: "count", Where: "foo(bar)"}}},
			},
		}, []string{
			`http address "127.0.0.1"`,
			`grpc address "no-port"`,
			"checkpoint_interval must not be negative",
			"idle_timeout must not be negative",
			"max_active_keys must not be negative",
			"max_body_bytes must not be negative",
			"store_cache_memory must not be negative",
			"shutdown_timeout must not be negative",
			`pipeline "a": key: is required`,
			`pipeline "a": aggregates.s: op sum needs a field`,
			`pipeline "b": aggregates.x: unknown op "median"`,
			`pipeline "c d": name must be non-empty`,
			`pipeline "filters": aggregates.w: where "foo(bar)" does not compile: unknown function foo()`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			want := make([][]string, len(tc.want))
			for i, w := range tc.want {
				want[i] = []string{w}
			}
			for _, p := range checkProblems(err, want) {
				t.Error(p)
			}
			var se *fold.SpecError
			if strings.Contains(strings.Join(tc.want, ""), "pipeline ") && !errors.As(err, &se) {
				t.Errorf("Validate error holds no *fold.SpecError: %v", err)
			}
		})
	}
}

// Validate does not fill in defaults or change the Config.
func TestValidateLeavesConfig(t *testing.T) {
	c := Config{Pipelines: map[string]PipelineConfig{"p": {Key: "k"}}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.KeyGroups != 0 || c.DataDir != "" || c.Pipelines["p"].DedupWindow != 0 {
		t.Errorf("Validate changed the config: %+v", c)
	}
}

func TestWithDefaults(t *testing.T) {
	d := Config{}.withDefaults()
	if d.Logger == nil {
		t.Error("no default logger")
	}
	if d.Metrics == nil {
		t.Error("no default metrics registry")
	}
	d.Logger, d.Metrics = nil, nil
	want := Config{
		DataDir:            DefaultDataDir,
		CheckpointInterval: actors.DefaultCheckpointInterval,
		CheckpointBytes:    actors.DefaultCheckpointBytes,
		CheckpointMaxBytes: actors.DefaultCheckpointMaxBytes,
		IdleTimeout:        actors.DefaultIdleTimeout,
		MaxMemory:          actors.DefaultMaxMemory,
		MaxBodyBytes:       DefaultMaxBodyBytes,
		ShutdownTimeout:    DefaultShutdownTimeout,

		MaxConcurrentIngests: DefaultMaxConcurrentIngests,
		MaxIngestBytes:       DefaultMaxIngestBytes,
		MaxBatchEvents:       DefaultMaxBatchEvents,
	}
	if !configEqual(d, want) {
		t.Errorf("defaults =\n%+v\nwant\n%+v", d, want)
	}

	// Set fields are kept; HTTPAddr stays empty for embedders.
	set := Config{DataDir: "d", KeyGroups: 8, CheckpointInterval: time.Second, CheckpointBytes: 1 << 20, CheckpointMaxBytes: 3 << 20, IdleTimeout: time.Minute,
		MaxActiveKeys: 10, MaxMemory: 1 << 25, MaxBodyBytes: 1024, ShutdownTimeout: time.Millisecond, MaxConcurrentIngests: 3,
		MaxIngestBytes: 1 << 20, MaxBatchEvents: 7}
	got := set.withDefaults()
	got.Logger, got.Metrics = nil, nil
	if !configEqual(got, set) {
		t.Errorf("withDefaults changed set fields:\n%+v\nwant\n%+v", got, set)
	}
}

// TestRedisConfig: a bad Redis URL or prefix is a configuration error, and
// the error never quotes the URL (it may hold a password).
func TestRedisConfig(t *testing.T) {
	base := "pipelines:\n  p:\n    key: k\n"
	for _, tc := range []struct{ yaml, want string }{
		{"redis: redis://127.0.0.1:6379/0\nredis_prefix: prod\n", ""},
		{"redis: rediss://user:s3cret@redis.example:6380/2\n", ""},
		{"redis: http://user:s3cret@redis.example:6379\n", "invalid URL scheme"},
		{"redis: redis://user:s3cret@redis.example:6379/notadb\n", "redis:"},
		{"redis_prefix: \"a{b}\"\n", "redis_prefix"},
	} {
		_, err := ParseConfig([]byte(tc.yaml + base))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.yaml, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one mentioning %q", tc.yaml, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%q: the error quotes the password: %v", tc.yaml, err)
		}
	}
}

// TestLoadConfigWindowsExample: the windows example declares what it shows.
func TestLoadConfigWindowsExample(t *testing.T) {
	c, err := LoadConfig("examples/windows.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Pipelines["logins"]; len(l.Windows) != 3 || len(l.Patterns) != 3 || l.TTL != 720*time.Hour {
		t.Errorf("examples/windows.yaml: %+v", l)
	}
	if _, err := New(c); err != nil {
		t.Error(err)
	}
}
