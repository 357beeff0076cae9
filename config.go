package keyfold

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
)

// PipelineConfig configures one pipeline; see fold.Spec for its fields.
type PipelineConfig = fold.Spec

// AggregateConfig configures one aggregate; see fold.AggregateSpec.
type AggregateConfig = fold.AggregateSpec

// Config configures a Node. The zero value of every field but Pipelines is a
// usable default (see Defaults); LoadConfig reads it from YAML.
type Config struct {
	// DataDir is where the embedded store keeps its files (default
	// "keyfold-data"). Ignored when Redis or Store is set.
	DataDir string `yaml:"data_dir"`
	// Redis, if set, is the URL of the Redis that keeps the node's state
	// instead of the embedded store: redis://[user:password@]host:port/db,
	// or rediss:// for TLS. Ignored when Store is set; embedders that need
	// Redis Cluster, Sentinel or their own client settings pass a
	// redisstore.Store as Store.
	Redis string `yaml:"redis"`
	// RedisPrefix starts every Redis key of the deployment (default
	// "keyfold"), so that several deployments can share one Redis.
	RedisPrefix string `yaml:"redis_prefix"`
	// RedisCluster makes Redis a Redis Cluster, whose seed nodes the URL
	// names: redis://host:port?addr=host2:port&addr=host3:port.
	RedisCluster bool `yaml:"redis_cluster"`
	// HTTPAddr is the HTTP API's listen address, e.g. "127.0.0.1:8080".
	// Empty serves no HTTP (for embedders); the CLI defaults it.
	HTTPAddr string `yaml:"http"`
	// GRPCAddr is the gRPC API's listen address, e.g. "127.0.0.1:9090".
	// Empty serves no gRPC (for embedders); the CLI defaults it.
	GRPCAddr string `yaml:"grpc"`
	// GRPCTLSCert and GRPCTLSKey, both set, are the PEM files of the
	// certificate (chain) and key the gRPC API serves TLS with; unset, it
	// serves plaintext.
	GRPCTLSCert string `yaml:"grpc_tls_cert"`
	GRPCTLSKey  string `yaml:"grpc_tls_key"`
	// KeyGroups is the number of key groups (default 256). It is fixed for a
	// deployment: a store created with another number refuses to open.
	KeyGroups uint32 `yaml:"key_groups"`
	// CheckpointInterval bounds the time between checkpoints and so the
	// replay after a crash (default 5s).
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
	// IdleTimeout passivates keys idle this long (default 5m).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxActiveKeys bounds the keys held in memory (default 100000).
	MaxActiveKeys int `yaml:"max_active_keys"`
	// MaxBodyBytes bounds an HTTP request body (default 8 MiB); larger
	// bodies get 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxConcurrentIngests bounds the HTTP ingest requests processed at once
	// (default 64), and with MaxBodyBytes the memory they take; more wait.
	MaxConcurrentIngests int `yaml:"max_concurrent_ingests"`
	// ShutdownTimeout bounds the wait for in-flight requests when draining
	// (default 10s).
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// Pipelines by name. At least one is required.
	Pipelines map[string]PipelineConfig `yaml:"pipelines"`

	// Store, if set, is used instead of the embedded store at DataDir or
	// Redis. The node closes it when Run returns.
	Store persistence.Store `yaml:"-"`
	// Logger receives the node's structured logs; nil discards them.
	Logger *slog.Logger `yaml:"-"`
	// Metrics is the registry the node registers its Prometheus metrics on
	// and serves at /metrics; nil makes one of its own (with the Go runtime
	// and process collectors). The node never uses the global registry.
	Metrics *prometheus.Registry `yaml:"-"`
}

// Defaults.
const (
	DefaultDataDir              = "keyfold-data"
	DefaultMaxBodyBytes         = 8 << 20
	DefaultMaxConcurrentIngests = 64
	DefaultShutdownTimeout      = 10 * time.Second
	// MaxKeyGroups bounds key_groups: each group costs a little memory and a
	// claim at start whether or not it holds keys.
	MaxKeyGroups = 1 << 16
)

// withDefaults returns c with every unset field at its default. It is the
// one place defaults are filled in.
func (c Config) withDefaults() Config {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.KeyGroups == 0 {
		c.KeyGroups = actors.DefaultGroups
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = actors.DefaultCheckpointInterval
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = actors.DefaultIdleTimeout
	}
	if c.MaxActiveKeys == 0 {
		c.MaxActiveKeys = actors.DefaultMaxActive
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxConcurrentIngests == 0 {
		c.MaxConcurrentIngests = DefaultMaxConcurrentIngests
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
		c.Metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return c
}

// Validate reports every problem of c at once, and compiles the pipelines
// to find theirs (each names the pipeline and the entry).
func (c Config) Validate() error {
	_, err := c.compile(true)
	return err
}

// compile validates c and compiles its pipelines. requirePipelines is false
// only when ParseConfig already reported why some are missing.
func (c Config) compile(requirePipelines bool) (map[string]*fold.Pipeline, error) {
	var errs []error
	if requirePipelines && len(c.Pipelines) == 0 {
		errs = append(errs, errors.New("keyfold: config: no pipelines: define at least one under pipelines:"))
	}
	for _, a := range []struct{ name, addr string }{{"http", c.HTTPAddr}, {"grpc", c.GRPCAddr}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("keyfold: config: %s address %q: %v", a.name, a.addr, err))
		}
	}
	if c.Redis != "" {
		parse := func(u string) error { _, err := redis.ParseURL(u); return err }
		if c.RedisCluster {
			parse = func(u string) error { _, err := redis.ParseClusterURL(u); return err }
		}
		if err := parse(c.Redis); err != nil {
			// The URL may hold a password: name the problem, not the URL.
			errs = append(errs, fmt.Errorf("keyfold: config: redis: %s", redisURLProblem(err)))
		}
	} else if c.RedisCluster {
		errs = append(errs, errors.New("keyfold: config: redis_cluster needs redis, the URL of the cluster's seed nodes"))
	}
	if err := (redisstore.Options{Prefix: c.RedisPrefix}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("keyfold: config: redis_prefix %q contains a brace", c.RedisPrefix))
	}
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		errs = append(errs, errors.New("keyfold: config: grpc_tls_cert and grpc_tls_key go together"))
	}
	if c.KeyGroups > MaxKeyGroups {
		errs = append(errs, fmt.Errorf("keyfold: config: key_groups %d is more than %d", c.KeyGroups, MaxKeyGroups))
	}
	for _, d := range []struct {
		name string
		v    int64
	}{
		{"checkpoint_interval", int64(c.CheckpointInterval)},
		{"idle_timeout", int64(c.IdleTimeout)},
		{"max_active_keys", int64(c.MaxActiveKeys)},
		{"max_body_bytes", c.MaxBodyBytes},
		{"max_concurrent_ingests", int64(c.MaxConcurrentIngests)},
		{"shutdown_timeout", int64(c.ShutdownTimeout)},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("keyfold: config: %s must not be negative", d.name))
		}
	}
	pipelines := make(map[string]*fold.Pipeline, len(c.Pipelines))
	for _, name := range slices.Sorted(maps.Keys(c.Pipelines)) {
		p, err := fold.Compile(name, c.Pipelines[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pipelines[name] = p
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return pipelines, nil
}

// LoadConfig reads a YAML configuration file (see ParseConfig).
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("keyfold: config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		// Name the file on every problem, one per line.
		errs := flatten(err)
		for i, e := range errs {
			errs[i] = fmt.Errorf("%s: %w", path, e)
		}
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// redisURLProblem describes a bad Redis URL without quoting it, since it
// may hold a password.
func redisURLProblem(err error) string {
	msg := strings.TrimPrefix(err.Error(), "redis: ")
	if strings.Contains(msg, "://") || strings.Contains(msg, "@") {
		msg = "not a valid URL"
	}
	return msg + " (want redis://[user:password@]host:port[/db] or rediss://…)"
}
