package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"time"

	"github.com/keyfold/keyfold"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

func newServe() *cobra.Command {
	var (
		configPath string
		dataDir    string
		httpAddr   string
		grpcAddr   string
		logLevel   string
		logFormat  string
		redisURL   string
		redisPfx   string
		redisClus  bool
		tlsCert    string
		tlsKey     string
		clusterNm  string
		advertise  string
		peers      []string
		lease      time.Duration
		pprofAddr  string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a node (embedded on-disk store in --data, or Redis with --redis)",
		Long: `Run a keyfold node. It keeps its state in the embedded on-disk store in
--data, or in Redis with --redis (the URL may also come from the
KEYFOLD_REDIS environment variable, which keeps a password out of the
process list), recovers it at start, serves the HTTP API on --http and the gRPC API on
--grpc (with health and reflection services), and
drains on SIGTERM or SIGINT: it stops accepting, finishes in-flight
batches, writes a checkpoint and exits 0.

With --cluster NAME, nodes sharing one Redis form a cluster: each serves
the key groups placement gives it and accepts every call, forwarding work
to the owner of a key's group. Members register with leases in Redis (a
node that stops renewing is dropped after --cluster-lease) or come from a
static --peers list. A member that drains hands its groups over (checkpoint,
release, deregister) before it stops listening.

A node that cannot reach Redis keeps retrying (and answers 503 meanwhile);
it does not exit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := keyfold.LoadConfig(configPath)
			if err != nil {
				return err
			}
			flags := cmd.Flags()
			if flags.Changed("data") || cfg.DataDir == "" {
				cfg.DataDir = dataDir
			}
			if flags.Changed("http") || cfg.HTTPAddr == "" {
				cfg.HTTPAddr = httpAddr
			}
			if flags.Changed("grpc") || cfg.GRPCAddr == "" {
				cfg.GRPCAddr = grpcAddr
			}
			if flags.Changed("redis") {
				cfg.Redis = redisURL
			} else if env := os.Getenv("KEYFOLD_REDIS"); env != "" && cfg.Redis == "" {
				cfg.Redis = env
			}
			if flags.Changed("redis-prefix") {
				cfg.RedisPrefix = redisPfx
			}
			if flags.Changed("redis-cluster") {
				cfg.RedisCluster = redisClus
			}
			if flags.Changed("cluster") {
				cfg.Cluster = clusterNm
			}
			if flags.Changed("advertise") {
				cfg.Advertise = advertise
			}
			if flags.Changed("peers") {
				cfg.Peers = peers
			}
			if flags.Changed("cluster-lease") {
				cfg.ClusterLease = lease
			}
			if flags.Changed("grpc-tls-cert") || flags.Changed("grpc-tls-key") {
				cfg.GRPCTLSCert, cfg.GRPCTLSKey = tlsCert, tlsKey
			}
			logger, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			logGoRuntime(logger, cfg.ApplyGoRuntime())
			if cfg.HugePages != "off" {
				go collapseHugePages(cmd.Context(), logger, cfg.HugePages == "on")
			}
			// go-redis logs every failed dial on its own global logger;
			// the store's failures already reach ours as warnings.
			redis.SetLogger(redisLogger{logger})
			node, err := keyfold.New(cfg)
			if err != nil {
				return err
			}
			if pprofAddr != "" {
				_, stop, err := servePprof(pprofAddr, logger)
				if err != nil {
					return err
				}
				defer stop()
			}
			return node.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&configPath, "config", "c", "keyfold.yaml", "pipeline configuration (YAML)")
	f.StringVar(&dataDir, "data", keyfold.DefaultDataDir, "directory of the embedded store")
	f.StringVar(&httpAddr, "http", "127.0.0.1:8080", "HTTP listen address")
	f.StringVar(&grpcAddr, "grpc", "127.0.0.1:9090", `gRPC listen address ("" for none)`)
	f.StringVar(&tlsCert, "grpc-tls-cert", "", "serve gRPC over TLS with this certificate (PEM; with --grpc-tls-key)")
	f.StringVar(&tlsKey, "grpc-tls-key", "", "the key of --grpc-tls-cert (PEM)")
	f.StringVar(&redisURL, "redis", "", "keep state in this Redis (redis://[user:password@]host:port/db, rediss:// for TLS) instead of --data")
	f.BoolVar(&redisClus, "redis-cluster", false, "--redis names a Redis Cluster's seed nodes: redis://host:port?addr=host2:port&addr=host3:port")
	f.StringVar(&redisPfx, "redis-prefix", "", `prefix of every Redis key, so deployments can share a Redis (default "keyfold")`)
	f.StringVar(&clusterNm, "cluster", "", "join the cluster of this name: the nodes sharing --redis divide the key groups (needs --redis and a reachable --advertise)")
	f.StringVar(&advertise, "advertise", "", "the host:port other members reach this node's gRPC API at (default: --grpc, if it names a host)")
	f.StringSliceVar(&peers, "peers", nil, "a static member list (every member's advertise address, comma-separated) instead of leases in Redis")
	f.DurationVar(&lease, "cluster-lease", 0, "failure detection: a member that stops renewing its lease is dropped after this (default 3s)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&pprofAddr, "pprof", "", "serve Go's profiles (net/http/pprof, /debug/pprof/) on this address, apart from the API (off by default: they expose the process's internals)")
	return cmd
}

// servePprof serves net/http/pprof's handlers on a listener of their own, so
// that profiles are never reachable on the API's address.
func servePprof(addr string, logger *slog.Logger) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof: %w", err)
	}
	// Contention is what a stall needs explained: sample one in 100 mutex
	// waits and blocking events of a millisecond or more (cheap at that rate).
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(int(time.Millisecond))
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("listening", "pprof", ln.Addr().String())
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// redisLogger hands go-redis's messages to slog at debug level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

func newLogger(level, format string) (*slog.Logger, error) {
	return newLoggerTo(os.Stderr, level, format)
}

func newLoggerTo(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// Durations as "1.5s", not integer nanoseconds (the text format
		// already prints them so).
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", format)
}

// collapseHugePages runs keyfold.CollapseHugePages for the process until
// ctx ends. Where the kernel cannot, it says so: at info level, or as a
// warning if the configuration asked for huge pages (huge_pages: on).
func collapseHugePages(ctx context.Context, logger *slog.Logger, asked bool) {
	err := keyfold.CollapseHugePages(ctx, keyfold.HugePageInterval, logger)
	switch {
	case err == nil:
	case errors.Is(err, keyfold.ErrHugePagesUnsupported) && !asked:
		logger.Info("huge pages: not collapsing", "reason", err)
	default:
		logger.Warn("huge pages: not collapsing", "err", err)
	}
}

// logGoRuntime logs the Go runtime's memory limit and GOGC in effect, where
// the limit came from (keyfold.GoRuntime), and its warnings.
func logGoRuntime(logger *slog.Logger, r keyfold.GoRuntime) {
	s := []metrics.Sample{{Name: "/gc/gomemlimit:bytes"}, {Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	limit := "none"
	if v := s[0].Value.Uint64(); v < math.MaxInt64 {
		limit = fmt.Sprintf("%d MiB", v>>20)
	}
	gogc := "off" // (the runtime reports off, -1, as a uint64)
	if v := int64(s[1].Value.Uint64()); v >= 0 {
		gogc = fmt.Sprint(v)
	}
	logger.Info("go runtime", "memory_limit", limit, "from", r.From, "gogc", gogc)
	for _, w := range r.Warnings {
		logger.Warn("go runtime: " + w)
	}
}
