package keyfold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/keyfold/keyfold/actors"
	"github.com/keyfold/keyfold/actors/fold"
	"github.com/keyfold/keyfold/cluster"
	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
	"github.com/keyfold/keyfold/persistence/redisstore"
	keyfoldv1 "github.com/keyfold/keyfold/proto/keyfold/v1"
	"github.com/keyfold/keyfold/services"
	"github.com/keyfold/keyfold/services/grpcapi"
	"github.com/keyfold/keyfold/services/httpapi"
	"github.com/keyfold/keyfold/services/metrics"
)

// Node is one keyfold node: its store, its keys' actors and its listeners.
type Node struct {
	cfg       Config
	pipelines map[string]*fold.Pipeline
	budget    *services.Budget // ingest memory, shared by HTTP and gRPC

	host      atomic.Pointer[actors.Host]  // set once recovered
	groups    atomic.Uint32                // the number of key groups, once known (keyGroups)
	clu       atomic.Pointer[cluster.Node] // set at start in a cluster: see router
	startedAt time.Time
	ready     chan struct{}
	draining  atomic.Bool
	drain     chan struct{} // closed when draining starts: ends subscriptions
	httpAddr  atomic.Pointer[string]
	grpcAddr  atomic.Pointer[string]

	ran     atomic.Bool
	mu      sync.Mutex
	cancel  context.CancelFunc // set while Run runs
	started bool
	closing bool
	done    chan struct{} // closed when a started Run returns

	disk atomic.Pointer[embedded.Store] // the embedded store, if it is the one
}

// IngestResult is the outcome of one ingest call: Accepted counts the
// events applied, Duplicates those skipped because their id was already
// applied.
type IngestResult = actors.Result

// KeyState is one key's state.
type KeyState struct {
	Pipeline   string         `json:"pipeline"`
	Key        string         `json:"key"`
	Seq        uint64         `json:"seq"`        // events applied, duplicates excluded
	Duplicates uint64         `json:"duplicates"` // events skipped: their id was already applied
	Aggregates map[string]any `json:"aggregates"`
	// For a pipeline with windows: the key's watermark, its events too late
	// for every window (dropped from them), and its windows — open ones and
	// emitted ones kept for allowed lateness.
	Watermark *time.Time    `json:"watermark,omitempty"`
	Late      *uint64       `json:"late,omitempty"`
	Windows   []WindowState `json:"windows,omitzero"`
	// LateWindows counts, per window name, the key's events too late for at
	// least one window of that name they fell in, whether other windows
	// took them or not (for a sliding window: it missed the oldest of its
	// windows). Every window of the pipeline is listed.
	LateWindows map[string]uint64 `json:"late_windows,omitempty"`
	// For a pipeline with patterns: each pattern's progress and matches.
	Patterns []PatternState `json:"patterns,omitempty"`
	// For a pipeline with a Go handler (Handle): the key's handler state
	// as JSON (absent while it has none; protobuf states as protojson
	// renders them), and the handler's calls on the key that failed.
	State           json.RawMessage `json:"state,omitempty"`
	HandlerFailures *uint64         `json:"handler_failures,omitempty"`
	// For a join (its keys are read by the join's name): each side's
	// buffered events (count, oldest and newest time) and the key's
	// results; Late counts its events too late to be joined.
	Join *JoinState `json:"join,omitempty"`
}

// JoinState is what a join's key buffers.
type JoinState = fold.JoinView

// PatternState is one pattern's progress on a key.
type PatternState = fold.PatternView

// WindowState is one window of a key.
type WindowState = fold.WindowView

// New validates cfg and returns a node. It does no I/O and starts nothing.
func New(cfg Config) (*Node, error) {
	cfg = cfg.withDefaults()
	pipelines, err := cfg.compile(true)
	if err != nil {
		return nil, err
	}
	return &Node{cfg: cfg, pipelines: pipelines, budget: services.NewBudget(cfg.MaxIngestBytes), startedAt: time.Now(), ready: make(chan struct{}), drain: make(chan struct{}), done: make(chan struct{})}, nil
}

// Ready is closed once the node has recovered its state and its listeners
// are bound.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// HTTPAddr returns the bound HTTP address once Run is listening (before
// recovery ends; "" until then, or if the node serves no HTTP).
func (n *Node) HTTPAddr() string {
	if p := n.httpAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// GRPCAddr returns the address the gRPC API listens on (known once Run
// started listening); "" until then, or if the node serves no gRPC.
func (n *Node) GRPCAddr() string {
	if p := n.grpcAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// Run opens the store, recovers every key group, serves, and blocks until
// ctx ends or Close is called; then it drains (stops accepting, finishes
// in-flight requests, checkpoints) and returns. It returns nil after a clean
// drain. Run may be called once.
func (n *Node) Run(ctx context.Context) error {
	if !n.ran.CompareAndSwap(false, true) {
		return errors.New("keyfold: Run called twice")
	}
	return n.run(ctx)
}

func (n *Node) run(ctx context.Context) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.mu.Lock()
	if n.closing {
		n.mu.Unlock()
		return nil
	}
	n.started, n.cancel = true, cancel
	n.mu.Unlock()
	defer close(n.done)
	log := n.cfg.Logger

	store := n.cfg.Store
	switch {
	case store != nil:
	case n.cfg.Redis != "":
		openRedis := redisstore.Open
		if n.cfg.RedisCluster {
			openRedis = redisstore.OpenCluster
		}
		s, err := openRedis(n.cfg.Redis, redisstore.Options{Prefix: n.cfg.RedisPrefix})
		if err != nil {
			return fmt.Errorf("keyfold: open store: %w", err)
		}
		log.Info("store: redis", "addr", s.Addr(), "cluster", n.cfg.RedisCluster, "prefix", s.Prefix())
		store = s
	default:
		s, err := embedded.Open(n.cfg.DataDir, embedded.Options{Logger: log, DiskReserve: n.cfg.DiskReserve, CacheSize: n.cfg.StoreCacheMemory, PreadTables: n.cfg.StoreMappedReads == "off"})
		if err != nil {
			return fmt.Errorf("keyfold: open store: %w", err)
		}
		log.Info("store: embedded", "dir", s.Dir())
		n.disk.Store(s)
		store = s
	}
	defer func() {
		if cerr := store.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("keyfold: close store: %w", cerr)
		}
	}()

	// Serve HTTP from the start, so /healthz answers during a long recovery
	// (and /readyz says 503 until it is done).
	stopHTTP := func() {}
	if n.cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", n.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("keyfold: listen http: %w", err)
		}
		addr := ln.Addr().String()
		n.httpAddr.Store(&addr)
		handler, err := n.httpHandler()
		if err != nil {
			ln.Close()
			return err
		}
		srv := &http.Server{
			Handler:           handler,
			ReadHeaderTimeout: httpapi.ReadHeaderTimeout,
			ReadTimeout:       httpapi.ReadTimeout,
			IdleTimeout:       httpapi.IdleTimeout,
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server failed", "err", err)
				cancel()
			}
		}()
		stopHTTP = func() {
			// Stop accepting, let in-flight requests finish.
			sctx, scancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
			defer scancel()
			if err := srv.Shutdown(sctx); err != nil {
				log.Warn("http shutdown", "err", err)
			}
			<-served
		}
		log.Info("listening", "http", addr)
	}
	stopGRPC, health, err := n.serveGRPC(cancel)
	if err != nil {
		stopHTTP()
		return err
	}
	stopServers := func() {
		health.Shutdown() // NOT_SERVING, before the listeners close
		stopHTTP()
		stopGRPC()
	}

	groups, err := n.resolveKeyGroups(ctx, store)
	if err != nil {
		stopServers()
		if ctx.Err() != nil {
			log.Info("stopped before recovery")
			return nil
		}
		return err
	}
	n.groups.Store(groups)
	var owned []uint32 // nil: all
	if n.cfg.Cluster != "" {
		owned = []uint32{} // placement gives the groups
	}
	host, err := actors.New(actors.Config{
		Owned:              owned,
		Store:              store,
		Pipelines:          n.pipelines,
		Groups:             groups,
		CheckpointInterval: n.cfg.CheckpointInterval,
		CheckpointBytes:    n.cfg.CheckpointBytes,
		CheckpointMaxBytes: n.cfg.CheckpointMaxBytes,
		IdleTimeout:        n.cfg.IdleTimeout,
		MaxActive:          n.cfg.MaxActiveKeys,
		MaxMemory:          n.cfg.MaxMemory,
		CacheMemory:        n.cfg.CacheMemory,
		Logger:             log,
	})
	if err != nil {
		stopServers()
		return err
	}
	var clu *cluster.Node
	if n.cfg.Cluster != "" {
		if clu, err = n.newCluster(store, host); err != nil {
			stopServers()
			return err
		}
		n.clu.Store(clu)
	}
	if err := host.Recover(ctx); err != nil {
		stopServers()
		if ctx.Err() != nil {
			log.Info("stopped during recovery")
			return nil // asked to stop: nothing was acknowledged yet
		}
		return err
	}
	n.host.Store(host)

	hostDone := make(chan error, 1)
	hostCtx, stopHost := context.WithCancel(context.Background())
	defer stopHost()
	go func() { hostDone <- host.Run(hostCtx) }()
	joined := clu == nil || clu.Join(ctx) == nil
	if joined {
		// SERVING before Ready: whoever waits on Ready finds the health
		// service saying so too.
		health.Resume()
		close(n.ready)
	}

	var hostErr error
	select {
	case <-ctx.Done():
	case hostErr = <-hostDone:
	}
	n.draining.Store(true)
	close(n.drain)
	log.Info("draining")
	if clu != nil {
		// Hand the groups over before the listeners close: calls still
		// arriving are routed to the next owners.
		health.Shutdown()
		lctx, lcancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
		clu.Leave(lctx)
		lcancel()
	}
	stopServers()
	if clu != nil {
		clu.Stop()
	}
	if hostErr == nil {
		stopHost()
		hostErr = <-hostDone
	}
	if hostErr != nil {
		return hostErr
	}
	log.Info("stopped")
	return nil
}

// serveGRPC serves the gRPC API, the standard health service (NOT_SERVING
// until the node is ready) and server reflection on GRPCAddr, if set. stop
// drains it: new calls are refused, calls in flight get ShutdownTimeout to
// finish, then open streams are cut.
func (n *Node) serveGRPC(fail context.CancelFunc) (stop func(), hs *health.Server, err error) {
	hs = health.NewServer()
	hs.SetServingStatus(keyfoldv1.Keyfold_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	hs.Shutdown() // every service NOT_SERVING until Resume
	if n.cfg.GRPCAddr == "" {
		return func() {}, hs, nil
	}
	ln, err := net.Listen("tcp", n.cfg.GRPCAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("keyfold: listen grpc: %w", err)
	}
	addr := ln.Addr().String()
	n.grpcAddr.Store(&addr)
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(n.cfg.MaxBodyBytes)),
		// Clients that ping more often than this are cut off, as are idle
		// connections after a while.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: httpapi.IdleTimeout}),
	}
	if n.cfg.GRPCTLSCert != "" {
		creds, err := credentials.NewServerTLSFromFile(n.cfg.GRPCTLSCert, n.cfg.GRPCTLSKey)
		if err != nil {
			ln.Close()
			return nil, nil, fmt.Errorf("keyfold: grpc tls: %w", err)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	grpcapi.Register(srv, grpcBackend{n}, grpcapi.Options{
		MaxConcurrentIngests: n.cfg.MaxConcurrentIngests,
		MaxBatchEvents:       n.cfg.MaxBatchEvents,
		Budget:               n.budget,
		Logger:               n.cfg.Logger,
	})
	grpcapi.RegisterCluster(srv, localBackend{n}, n.cfg.Logger)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil {
			n.cfg.Logger.Error("grpc server failed", "err", err)
			fail()
		}
	}()
	n.cfg.Logger.Info("listening", "grpc", addr, "tls", n.cfg.GRPCTLSCert != "")
	return func() {
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(n.cfg.ShutdownTimeout):
			srv.Stop()
			<-done
		}
		<-served
	}, hs, nil
}

// httpHandler is the API plus /metrics, instrumented.
func (n *Node) httpHandler() (http.Handler, error) {
	if err := metrics.RegisterHost(n.cfg.Metrics, n.Stats); err != nil {
		return nil, fmt.Errorf("keyfold: metrics: %w", err)
	}
	// Read through router at each scrape: a member's cluster starts later.
	if err := metrics.RegisterCluster(n.cfg.Metrics, func() cluster.Stats { return n.router().Stats() }); err != nil {
		return nil, fmt.Errorf("keyfold: metrics: %w", err)
	}
	if n.disk.Load() != nil {
		if err := metrics.RegisterDisk(n.cfg.Metrics, n.diskStats); err != nil {
			return nil, fmt.Errorf("keyfold: metrics: %w", err)
		}
	}
	hm, err := metrics.NewHTTP(n.cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("keyfold: metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.cfg.Metrics, promhttp.HandlerOpts{}))
	mux.Handle("/", httpapi.New(httpBackend{n}, httpapi.Options{
		MaxBodyBytes:         n.cfg.MaxBodyBytes,
		MaxConcurrentIngests: n.cfg.MaxConcurrentIngests,
		MaxBatchEvents:       n.cfg.MaxBatchEvents,
		Budget:               n.budget,
		AllowedOrigins:       n.cfg.AllowedOrigins,
		Logger:               n.cfg.Logger,
	}))
	return hm.Wrap(mux), nil
}

// Close stops a running node and waits for Run to return. It is safe to
// call more than once, and before Run (then Run returns at once).
func (n *Node) Close() error {
	n.mu.Lock()
	n.closing = true
	cancel, started := n.cancel, n.started
	n.mu.Unlock()
	if started {
		cancel()
		<-n.done
	}
	return nil
}

// Ingest validates a batch of events of one pipeline (each a JSON object),
// logs it durably, applies it, and returns how many events were applied and
// how many were duplicates. An invalid event rejects the whole batch with a
// *BatchError (errors.Is ErrInvalidEvent) and nothing is applied. In a
// cluster, each owner logs its keys' share; the call returns when all are
// durable.
//
// The batch is logged and applied from the events' bytes, which the node
// keeps, maybe after ctx ends: do not change them after the call.
func (n *Node) Ingest(ctx context.Context, pipeline string, events []json.RawMessage) (IngestResult, error) {
	raws := make([][]byte, len(events))
	for i, e := range events {
		raws[i] = e
	}
	p, err := n.SubmitIngest(ctx, pipeline, raws)
	if err != nil {
		return IngestResult{}, err
	}
	return p.Wait(ctx)
}

// SubmitIngest validates a batch as Ingest does and queues it for logging
// without waiting: batches submitted one after the other are logged and
// applied in that order (in a cluster: those of one key; a share routed
// again while its group moves may come after a later batch). Wait for the
// outcome with the returned PendingIngest (this is how the gRPC stream
// keeps a stream's batches in order while several are in flight). As with
// Ingest, the node keeps the events' bytes: do not change them.
func (n *Node) SubmitIngest(ctx context.Context, pipeline string, events [][]byte) (PendingIngest, error) {
	r, err := n.route(pipeline)
	if err != nil {
		return nil, err
	}
	return r.Submit(ctx, pipeline, events)
}

// PendingIngest is a submitted batch: its Wait waits until the batch is
// durable and applied, or ctx ends (it may then still be applied). It is
// the host's, or in a cluster the router's, passed on as it is.
type PendingIngest = actors.Pending

// Delete erases one key: its state, the ids it remembers and its snapshot.
// The deletion is logged before Delete returns (it survives a crash), and
// the key's next event starts it afresh. Deleting a key without state
// succeeds.
func (n *Node) Delete(ctx context.Context, pipeline, key string) error {
	r, err := n.route(pipeline)
	if err != nil {
		return err
	}
	return r.Delete(ctx, pipeline, key)
}

// Pipelines returns the configured pipelines by name.
func (n *Node) Pipelines() map[string]PipelineConfig { return maps.Clone(n.cfg.Pipelines) }

// Query returns one key's state, read through its actor: it reflects every
// ingest acknowledged before the call. A key never seen is ErrNotFound. In
// a cluster the key's owner answers.
func (n *Node) Query(ctx context.Context, pipeline, key string) (KeyState, error) {
	v, err := n.query(ctx, pipeline, key)
	if err != nil {
		return KeyState{}, err
	}
	return n.keyState(pipeline, key, v), nil
}

// query reads a key's state as the host gives it (in a cluster: its
// owner's host), the one form Query and the gRPC API make theirs from.
func (n *Node) query(ctx context.Context, pipeline, key string) (actors.KeyView, error) {
	r, err := n.route(pipeline)
	if err != nil {
		return actors.KeyView{}, err
	}
	return r.Query(ctx, pipeline, key)
}

// stateResponse is the host's view of a key as the gRPC APIs give it.
func (n *Node) stateResponse(pipeline, key string, v actors.KeyView) (*keyfoldv1.GetStateResponse, error) {
	return cluster.StateResponse(pipeline, key, v, n.pipelines[pipeline].Timed())
}

// keyState is the host's view of a key as the embedding API gives it.
func (n *Node) keyState(pipeline, key string, v actors.KeyView) KeyState {
	ks := KeyState{Pipeline: pipeline, Key: key, Seq: v.Seq, Duplicates: v.Duplicates, Aggregates: v.Aggregates}
	if n.pipelines[pipeline].Timed() {
		ks.Late, ks.Windows, ks.Patterns, ks.LateWindows, ks.Join = &v.Late, v.Windows, v.Patterns, v.LateWindows, v.Join
		if v.Watermark > 0 { // none yet: null
			wm := time.UnixMilli(v.Watermark).UTC()
			ks.Watermark = &wm
		}
		if ks.Windows == nil && v.Join == nil {
			ks.Windows = []WindowState{}
		}
	}
	if n.pipelines[pipeline].HasHandler() {
		ks.State, ks.HandlerFailures = v.State, &v.HandlerFailures
	}
	return ks
}

// serving returns the host for a call on pipeline, or why the node cannot
// serve one yet.
func (n *Node) serving(pipeline string) (*actors.Host, error) {
	if _, ok := n.pipelines[pipeline]; !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownPipeline, pipeline)
	}
	h := n.host.Load()
	if h == nil {
		return nil, ErrNotReady
	}
	if !n.router().Routable() {
		return nil, ErrNotReady // no member list yet: nowhere to route
	}
	return h, nil
}

// route returns the router for a call on pipeline, as serving does.
func (n *Node) route(pipeline string) (router, error) {
	if _, err := n.serving(pipeline); err != nil {
		return nil, err
	}
	return n.router(), nil
}

// Stats returns the node's counters.
func (n *Node) Stats() actors.Stats {
	if h := n.host.Load(); h != nil {
		return h.Stats()
	}
	return actors.Stats{}
}

// Serving reports whether the node accepts requests (ready, not draining,
// not failed, and its embedded store's disk not full: see the README's
// Operations section).
func (n *Node) Serving() bool {
	h := n.host.Load()
	// (A member is ready once it serves its share: Joined.)
	return h != nil && n.router().Joined() && !n.draining.Load() && h.Err() == nil && !n.diskFull()
}

// diskFull reports whether the embedded store refuses writes: for lack of
// space, or until it has reopened after a failed write.
func (n *Node) diskFull() bool {
	s := n.disk.Load()
	if s == nil {
		return false
	}
	d := s.Disk()
	return d.Full || d.Failed != nil
}

func (n *Node) diskStats() metrics.DiskStats {
	d := n.disk.Load().Disk()
	return metrics.DiskStats{Full: d.Full, FreeBytes: d.FreeBytes, ReserveBytes: d.ReserveBytes, FlushedBytes: d.FlushedBytes, CompactedBytes: d.CompactedBytes, UnmappedTables: d.UnmappedTables}
}

// resolveKeyGroups returns the number of key groups the node runs with: the
// configured one; unset, the one the store records, so that a deployment
// keeps its number (a store created with key_groups set needs it set no
// more); for a new store, DefaultKeyGroups. It retries
// while the store is unavailable, as recovery does, until ctx ends.
func (n *Node) resolveKeyGroups(ctx context.Context, store persistence.Store) (uint32, error) {
	if n.cfg.KeyGroups != 0 {
		return n.cfg.KeyGroups, nil
	}
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		groups, err := persistence.RecordedGroups(ctx, store)
		if err == nil {
			from := "recorded in the store"
			if groups == 0 {
				groups, from = DefaultKeyGroups, "the default, for a new store"
			}
			n.cfg.Logger.Info("key groups", "groups", groups, "from", from)
			return groups, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		n.cfg.Logger.Warn("store unavailable; retrying", "err", err, "in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// keyGroups returns the number of key groups the node runs with, 0 until
// its store said (resolveKeyGroups).
func (n *Node) keyGroups() uint32 { return n.groups.Load() }
