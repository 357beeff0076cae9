package keyfold

import (
	"cmp"
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
	"github.com/keyfold/keyfold/cluster"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
)

// PipelineConfig configures one pipeline; see fold.Spec for its fields.
type PipelineConfig = fold.Spec

// JoinConfig configures one join; see fold.JoinSpec.
type JoinConfig = fold.JoinSpec

// AggregateConfig configures one aggregate; see fold.AggregateSpec.
type AggregateConfig = fold.AggregateSpec

// Config configures a Node. The zero value of every field but Pipelines is a
// usable default (see Defaults); LoadConfig reads it from YAML.
type Config struct {
	// DataDir is where the embedded store keeps its files (default
	// "keyfold-data"). Ignored when Redis or Store is set.
	DataDir string `yaml:"data_dir"`
	// DiskReserve is the free space, in bytes, the embedded store keeps on
	// DataDir's filesystem: ingest that would leave less is refused (503).
	// 0 is the default (64 MiB, or a tenth of a filesystem below 640 MiB);
	// negative turns the check off. See embedded.Options.DiskReserve.
	DiskReserve int64 `yaml:"disk_reserve"`
	// StoreCacheMemory is the size in bytes of the embedded store's block
	// cache (Pebble's), which holds recently read blocks of snapshots
	// beyond the keys in memory, up to this size; 0 is the default (256
	// MiB, used as blocks are read). It is memory on top of MaxMemory.
	// Ignored when Redis or Store is set. See embedded.Options.CacheSize.
	StoreCacheMemory int64 `yaml:"store_cache_memory"`
	// StoreMappedReads says whether the embedded store reads its tables
	// through mappings of their files (Unix): "" or "on" (the default),
	// or "off", pread(2) for every block read. A read of a key beyond the
	// memory then costs no system call once its page is mapped; the
	// mapped pages count in the process's resident memory (the page
	// cache's, which the kernel may reclaim), and in the Linux OOM
	// killer's score. See embedded.Options.PreadTables.
	StoreMappedReads string `yaml:"store_mapped_reads"`
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
	// KeyGroups is the number of key groups. It is fixed for a deployment:
	// a store created with another number refuses to open. Unset, a node
	// takes the number its store records; a new store gets
	// DefaultKeyGroups (256).
	KeyGroups uint32 `yaml:"key_groups"`
	// CheckpointInterval bounds the time between checkpoints of a quiet
	// node (default 30s).
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
	// CheckpointBytes starts a checkpoint once this many bytes were logged
	// since the last one began (default 128 MiB), if the keys changed since
	// took two events each on average; CheckpointMaxBytes whatever they
	// took (default 256 MiB, or 4 × a CheckpointBytes set; a
	// CheckpointMaxBytes set alone below 128 MiB is where checkpoints
	// start too: actors.CheckpointBounds). The latter bounds the replay
	// after a crash by the log's size; the former spares a checkpoint that
	// would write about a snapshot per event (many more keys than events
	// between two checkpoints).
	CheckpointBytes    int64 `yaml:"checkpoint_bytes"`
	CheckpointMaxBytes int64 `yaml:"checkpoint_max_bytes"`
	// IdleTimeout passivates keys idle this long (default 5m).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxActiveKeys bounds the keys with an actor: the recently used ones.
	// Passivated keys stay in memory without one, within MaxMemory. 0 (the
	// default): as many as a quarter of MaxMemory holds at 1.5 KiB each
	// (174762 for 1 GiB).
	MaxActiveKeys int `yaml:"max_active_keys"`
	// MaxMemory bounds, in bytes, the memory of the keys held in memory
	// (default 1 GiB): each active key is charged 1.5 KiB, each key resident
	// without an actor its estimated size (a few hundred bytes with a few
	// aggregates, plus its remembered ids). Keys beyond it are only in the
	// store and are read back on their next event or query.
	MaxMemory int64 `yaml:"max_memory"`
	// CacheMemory is the part of MaxMemory that keeps keys which left
	// memory in the snapshot cache, packed (about 55 B for a key with a few
	// aggregates, outside the Go heap): their next event or query decodes
	// them instead of reading the store. 0 (the default): a quarter of
	// MaxMemory, if that is at least 48 MiB, the cache's smallest size.
	// Negative: no cache.
	CacheMemory int64 `yaml:"cache_memory"`
	// GoMemoryLimit is the soft memory limit of the Go runtime
	// (runtime/debug.SetMemoryLimit) that keyfold serve sets, in bytes: the
	// collector works harder as the process's Go memory nears it. 0 (the
	// default): the GOMEMLIMIT environment variable if it is set, else 2 ×
	// (MaxMemory + MaxIngestBytes), at most 90% of the memory the process
	// may use (its cgroup's limit or the machine's, the smaller) less the
	// node's memory the runtime does not count (the snapshot cache's
	// entries; with cgo, the embedded store's block cache, 15% more for its
	// slop, and its memtables), and at least 256 MiB. (Without cgo those
	// two are Go memory, and are added to the limit.) Negative: no limit.
	// New never changes the process's runtime (an embedding program owns
	// it); see ApplyGoRuntime.
	GoMemoryLimit int64 `yaml:"go_memory_limit"`
	// GoGCPercent is the collector's target percentage (GOGC) keyfold serve
	// sets: a collection starts once the heap has grown this much over what
	// the last one left live. 0 (the default): the GOGC environment variable
	// if it is set, else 300 while a memory limit applies (then the limit,
	// not the heap's growth, paces the collector once the heap is large),
	// else Go's 100. Negative: off, collections only near the memory limit,
	// which must then apply.
	GoGCPercent int `yaml:"go_gc_percent"`
	// HugePages says whether keyfold serve collapses its process's
	// resident memory into huge pages (CollapseHugePages, Linux 6.1 and
	// later): windows of 2 MiB wholly resident, never one with a page the
	// Go runtime gave back or one only read, so it takes back no memory
	// (but for a page given back during a collapse). A page given back
	// from a collapsed window later stays charged to the process's cgroup
	// until the kernel splits the huge page, which it does when it needs
	// the memory. "" (the default): where the kernel can and its policy is
	// not "never"; "on": the same, and a warning where it cannot; "off":
	// never (the kernel's transparent huge page policy alone decides).
	// Like GoGCPercent, for keyfold serve: New never changes the process.
	HugePages string `yaml:"huge_pages"`
	// MaxBodyBytes bounds an HTTP request body (default 8 MiB); larger
	// bodies get 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxConcurrentIngests bounds the ingest requests processed at once
	// (default 64), per API; a request takes a slot once its body is read.
	// Over HTTP one that finds none within a second gets 429; a gRPC call
	// waits for one until its deadline (then ResourceExhausted).
	MaxConcurrentIngests int `yaml:"max_concurrent_ingests"`
	// MaxIngestBytes bounds the memory of the ingest requests in flight,
	// HTTP and gRPC together (default 256 MiB): their bodies (messages) as
	// they are read plus 384 bytes per event. A request that does not fit
	// is refused at once with 429 / ResourceExhausted and a retry delay.
	// It must be at least MaxBodyBytes.
	MaxIngestBytes int64 `yaml:"max_ingest_bytes"`
	// MaxBatchEvents bounds the events of one ingest request or stream
	// batch (default 100000); a larger one gets 413 / InvalidArgument.
	MaxBatchEvents int `yaml:"max_batch_events"`
	// AllowedOrigins lists the web origins (scheme://host[:port], or "*")
	// whose pages may write over HTTP (POST events, DELETE a key). A write
	// with an Origin header not listed gets 403; clients that are not
	// browsers send none. Default: none, so no web page can write.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// ShutdownTimeout bounds the wait for in-flight requests when draining
	// (default 10s).
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// Cluster, if set, makes the node a member of the cluster of that name:
	// the nodes that share the store (Redis) and the name divide the key
	// groups among themselves, and each accepts every call, passing work on
	// to the owner of a key's group. Members register with leases in Redis,
	// or are listed in Peers. All nodes of one store must use the same
	// name.
	Cluster string `yaml:"cluster"`
	// Advertise is the address the other members reach this node's gRPC
	// API at (host:port); it is the node's member id. Default: the gRPC
	// listen address, if it names a specific host.
	Advertise string `yaml:"advertise"`
	// Peers, if set, is a static member list (every member's advertised
	// address, this node's included) instead of leases in Redis. A member
	// that is down keeps its groups (nothing takes them over) until it is
	// back.
	Peers []string `yaml:"peers"`
	// ClusterLease is how long a member stays listed without renewing its
	// lease: the failure detection time (default 3s; renewed every third).
	ClusterLease time.Duration `yaml:"cluster_lease"`
	// Pipelines by name. At least one is required.
	Pipelines map[string]PipelineConfig `yaml:"pipelines"`
	// Joins by name: each joins the events of two pipelines with the same
	// key (see the README's Joins). A join's keys are read, and its results
	// listed, by its name, as a pipeline's; its name must differ from every
	// pipeline's. A store created before joins existed cannot serve them
	// (Run refuses to start, saying why).
	Joins map[string]JoinConfig `yaml:"joins"`

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
	DefaultMaxIngestBytes       = services.DefaultMaxIngestBytes
	DefaultMaxBatchEvents       = services.DefaultMaxBatchEvents
	DefaultShutdownTimeout      = 10 * time.Second
	// DefaultKeyGroups is the number of key groups of a new store when
	// key_groups is unset (a node takes the number an existing store
	// records). 64 cost a node alone on Redis a third less Redis CPU per
	// event, and lengthened the ack tail at half load on the embedded
	// store (docs/decisions/2026-12-05-key-groups.md).
	DefaultKeyGroups = actors.DefaultGroups
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
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = actors.DefaultCheckpointInterval
	}
	c.CheckpointBytes, c.CheckpointMaxBytes = actors.CheckpointBounds(c.CheckpointBytes, c.CheckpointMaxBytes)
	if c.IdleTimeout == 0 {
		c.IdleTimeout = actors.DefaultIdleTimeout
	}
	c.MaxMemory = c.maxMemory()
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxConcurrentIngests == 0 {
		c.MaxConcurrentIngests = DefaultMaxConcurrentIngests
	}
	if c.MaxBatchEvents == 0 {
		c.MaxBatchEvents = DefaultMaxBatchEvents
	}
	c.MaxIngestBytes = c.maxIngestBytes()
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
		c.Metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if rf := residentFileCollector(); rf != nil {
			c.Metrics.MustRegister(rf)
		}
	}
	return c
}

// maxMemory is the max_memory in effect: the default when unset.
func (c Config) maxMemory() int64 { return cmp.Or(c.MaxMemory, actors.DefaultMaxMemory) }

// maxIngestBytes is the max_ingest_bytes in effect: when unset, the default
// or what the largest request needs, the larger.
func (c Config) maxIngestBytes() int64 {
	return cmp.Or(c.MaxIngestBytes, max(DefaultMaxIngestBytes, c.largestIngest()))
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
		errs = append(errs, errors.New("keyfold: config: no pipelines: define at least one in the pipelines section"))
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
	errs = append(errs, c.checkCluster()...)
	if c.CacheMemory > 0 && c.CacheMemory < actors.MinCacheMemory {
		errs = append(errs, fmt.Errorf("keyfold: config: cache_memory %d is below %d MiB, the snapshot cache's smallest size (-1: no cache)", c.CacheMemory, actors.MinCacheMemory>>20))
	}
	// (Against the max_memory in effect: cache_memory alone is a valid
	// setting. A negative max_memory is refused below.)
	if maxMemory := c.maxMemory(); maxMemory > 0 && c.CacheMemory > maxMemory {
		errs = append(errs, fmt.Errorf("keyfold: config: cache_memory %d is more than max_memory %d, of which it is a part", c.CacheMemory, maxMemory))
	}
	if c.CheckpointBytes > 0 && c.CheckpointMaxBytes > 0 && c.CheckpointMaxBytes < c.CheckpointBytes {
		errs = append(errs, fmt.Errorf("keyfold: config: checkpoint_max_bytes %d is less than checkpoint_bytes %d, the log at which a checkpoint may start", c.CheckpointMaxBytes, c.CheckpointBytes))
	}
	if c.GoMemoryLimit > 0 && c.GoMemoryLimit < MinGoMemoryLimit {
		errs = append(errs, fmt.Errorf("keyfold: config: go_memory_limit %d is below %d MiB, too little for a node's process (negative: no limit)", c.GoMemoryLimit, MinGoMemoryLimit>>20))
	}
	if c.GoGCPercent < 0 && c.GoMemoryLimit < 0 {
		errs = append(errs, errors.New("keyfold: config: go_gc_percent is negative (off) and go_memory_limit too: nothing would start a collection"))
	}
	for _, o := range []struct{ name, v string }{{"huge_pages", c.HugePages}, {"store_mapped_reads", c.StoreMappedReads}} {
		switch o.v {
		case "", "on", "off":
		default:
			errs = append(errs, fmt.Errorf("keyfold: config: %s %q: want on or off", o.name, o.v))
		}
	}
	if c.KeyGroups > MaxKeyGroups {
		errs = append(errs, fmt.Errorf("keyfold: config: key_groups %d is more than %d", c.KeyGroups, MaxKeyGroups))
	}
	for _, d := range []struct {
		name string
		v    int64
	}{
		{"checkpoint_interval", int64(c.CheckpointInterval)},
		{"checkpoint_bytes", c.CheckpointBytes},
		{"checkpoint_max_bytes", c.CheckpointMaxBytes},
		{"idle_timeout", int64(c.IdleTimeout)},
		{"max_active_keys", int64(c.MaxActiveKeys)},
		{"max_memory", c.MaxMemory},
		{"store_cache_memory", c.StoreCacheMemory},
		{"max_body_bytes", c.MaxBodyBytes},
		{"max_concurrent_ingests", int64(c.MaxConcurrentIngests)},
		{"max_ingest_bytes", c.MaxIngestBytes},
		{"max_batch_events", int64(c.MaxBatchEvents)},
		{"shutdown_timeout", int64(c.ShutdownTimeout)},
		{"cluster_lease", int64(c.ClusterLease)},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("keyfold: config: %s must not be negative", d.name))
		}
	}
	if need := c.largestIngest(); c.MaxIngestBytes > 0 && c.MaxIngestBytes < need {
		errs = append(errs, fmt.Errorf("keyfold: config: max_ingest_bytes %d is less than max_body_bytes + max_batch_events × %d = %d: the largest requests would never fit", c.MaxIngestBytes, services.EventCost, need))
	}
	for _, o := range c.AllowedOrigins {
		if o != "*" && (!strings.Contains(o, "://") || strings.HasSuffix(o, "/")) {
			errs = append(errs, fmt.Errorf("keyfold: config: allowed_origins: %q is not an origin (scheme://host[:port], no path) or \"*\"", o))
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
	sides := maps.Clone(pipelines)
	for _, name := range slices.Sorted(maps.Keys(c.Joins)) {
		spec := c.Joins[name]
		if _, ok := sides[spec.Left.Pipeline]; !ok && c.Pipelines[spec.Left.Pipeline].Key != "" {
			continue // its side failed to compile: reported above
		}
		if _, ok := sides[spec.Right.Pipeline]; !ok && c.Pipelines[spec.Right.Pipeline].Key != "" {
			continue
		}
		p, err := fold.CompileJoin(name, spec, sides)
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

// largestIngest is what the largest request admitted reserves of the
// ingest budget: a body of max_body_bytes with max_batch_events events.
func (c Config) largestIngest() int64 {
	body, events := c.MaxBodyBytes, int64(c.MaxBatchEvents)
	if body <= 0 {
		body = DefaultMaxBodyBytes
	}
	if events <= 0 {
		events = DefaultMaxBatchEvents
	}
	return body + events*services.EventCost
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

// MinClusterLease bounds cluster_lease from below: it is renewed every
// third of it, and a renewal must fit in that time.
const MinClusterLease = 300 * time.Millisecond

// checkCluster validates the cluster settings.
func (c Config) checkCluster() []error {
	if c.Cluster == "" {
		if c.Advertise != "" || len(c.Peers) > 0 || c.ClusterLease != 0 {
			return []error{errors.New("keyfold: config: advertise, peers and cluster_lease need cluster (a cluster name)")}
		}
		return nil
	}
	var errs []error
	if strings.ContainsAny(c.Cluster, "{} \t\r\n") {
		errs = append(errs, fmt.Errorf("keyfold: config: cluster name %q must not contain braces or spaces", c.Cluster))
	}
	if c.GRPCAddr == "" {
		errs = append(errs, errors.New("keyfold: config: a cluster member needs a gRPC address (grpc): the members talk over it"))
	}
	if c.Redis == "" && c.Store == nil {
		errs = append(errs, errors.New("keyfold: config: a cluster needs a store its members share: set redis"))
	}
	advertise := c.Advertise
	if advertise == "" {
		advertise = c.GRPCAddr
		if host, _, err := net.SplitHostPort(c.GRPCAddr); err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
			errs = append(errs, fmt.Errorf("keyfold: config: grpc listens on %q: set advertise to the address the other members reach this node at", c.GRPCAddr))
			advertise = ""
		}
	}
	if advertise != "" {
		if err := cluster.ValidAdvertise(advertise); err != nil && !strings.HasSuffix(advertise, ":0") {
			errs = append(errs, fmt.Errorf("keyfold: config: %w", err))
		}
	}
	for _, p := range c.Peers {
		if err := cluster.ValidAdvertise(p); err != nil {
			errs = append(errs, fmt.Errorf("keyfold: config: peers: %w", err))
		}
	}
	if c.ClusterLease > 0 && c.ClusterLease < MinClusterLease {
		errs = append(errs, fmt.Errorf("keyfold: config: cluster_lease %s is below %s", c.ClusterLease, MinClusterLease))
	}
	return errs
}
