package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/persistence"
)

// Store keeps keyfold's logs and snapshots in Redis. It is safe for
// concurrent use.
type Store struct {
	c       redis.UniversalClient
	cluster bool // c is a Redis Cluster (or Ring) client: one slot per script
	owned   bool // Close closes c
	k       keys
	page    int64
	closed  atomic.Bool
	// packed: the store's format allows packed snapshots (set by
	// CheckGroups).
	packed atomic.Bool
	// format is the store's layout version (keys.go) once known: from
	// CheckGroups, or from the first group operation (layout); 0 before.
	format atomic.Uint32

	// last holds, per group this store claimed, the last position it knows
	// the group's log to have. Appends are conditional on it: a call that
	// go-redis sends twice (it retries on timeouts and follows cluster
	// redirections) appends once, and an append after one whose outcome is
	// unknown and which landed fails rather than add a record twice. In
	// formats 1 and 2 (appendScript) the log must end exactly there; in
	// format 3 the record's ID, the position after it, must be above the
	// log's last one, so a log that lost its last records under its owner
	// (Redis lost acknowledged writes) takes the next one after a gap
	// (keys.go). A group's next claim refreshes it.
	lastMu sync.Mutex
	last   map[uint32]persistence.Position
	// appending serialises the appends of each group in this process, so
	// that they do not fail each other's position checks.
	appending sync.Map // uint32 -> *sync.Mutex
}

var (
	_ persistence.Store           = (*Store)(nil)
	_ persistence.PackedSnapshots = (*Store)(nil)
	_ persistence.GroupsRecorder  = (*Store)(nil)
)

// New returns a store that uses c, which may be a single-node, Sentinel
// (failover) or Redis Cluster client: configure TLS, timeouts, hooks and
// topology on it. New does no I/O. Closing the store does not close c.
//
// Writes are durable when Redis has them on disk: run Redis with
// appendonly yes and appendfsync always for an acknowledgement to survive a
// crash of the Redis host (see the README).
func New(c redis.UniversalClient, opts Options) (*Store, error) {
	if c == nil {
		return nil, errors.New("redisstore: nil client")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	_, cluster := c.(*redis.ClusterClient)
	if _, ring := c.(*redis.Ring); ring {
		cluster = true
	}
	return &Store{c: c, cluster: cluster, k: keys{opts.Prefix}, page: int64(opts.ReadPageSize), last: map[uint32]persistence.Position{}}, nil
}

// defaultSocketTimeout is Open's read and write timeout.
const defaultSocketTimeout = 3 * time.Second

// Open connects to the Redis at url, a redis:// or rediss:// (TLS) URL with
// an optional user, password and database number, e.g.
// redis://user:secret@localhost:6379/0. The store owns the client: Close
// closes it. Open does no I/O; an unreachable Redis shows at the first call.
func Open(url string, opts Options) (*Store, error) {
	ro, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	// Socket timeouts bound each call, so a Redis that stops answering fails
	// calls within seconds rather than at the caller's deadline. No
	// retries: a retry on a new connection waits for the connection's own
	// handshake too, and the caller (the host) retries what failed anyway;
	// go-redis checks pooled connections before use, so a Redis restart
	// costs no failed calls. The URL's read_timeout, write_timeout and
	// max_retries parameters override these.
	clientDefaults(&ro.ReadTimeout, &ro.WriteTimeout, &ro.MaxRetries)
	return open(redis.NewClient(ro), opts)
}

// OpenCluster connects to the Redis Cluster whose seed nodes the URL names:
// redis://[user:password@]host:port?addr=host2:port&addr=host3:port (TLS
// with rediss://). The store owns the client, with the timeouts Open sets;
// cluster redirections (MOVED, ASK) are followed, and appends stay
// conditional, so a redirected script still appends once.
func OpenCluster(url string, opts Options) (*Store, error) {
	co, err := redis.ParseClusterURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	clientDefaults(&co.ReadTimeout, &co.WriteTimeout, &co.MaxRetries)
	return open(redis.NewClusterClient(co), opts)
}

// clientDefaults sets the timeouts and retries Open documents where the URL
// left them unset.
func clientDefaults(read, write *time.Duration, retries *int) {
	if *read == 0 {
		*read = defaultSocketTimeout
	}
	if *write == 0 {
		*write = defaultSocketTimeout
	}
	if *retries == 0 {
		*retries = -1
	}
}

// open returns a store that owns c.
func open(c redis.UniversalClient, opts Options) (*Store, error) {
	s, err := New(c, opts)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// Addr returns the address of the Redis server (the first seed of a
// cluster client), without credentials, for logs.
func (s *Store) Addr() string {
	switch o := s.c.(type) {
	case *redis.Client:
		return o.Options().Addr
	case *redis.ClusterClient:
		if a := o.Options().Addrs; len(a) > 0 {
			return a[0]
		}
	}
	return ""
}

// Client returns the store's Redis client (a cluster's membership
// registry shares it).
func (s *Store) Client() redis.UniversalClient { return s.c }

// Prefix returns the prefix of the store's keys.
func (s *Store) Prefix() string { return s.k.prefix }

// Close makes later calls fail with persistence.ErrClosed and, if the store
// was opened with Open, closes its client. Close is safe to call more than
// once.
func (s *Store) Close() error {
	if s.closed.Swap(true) || !s.owned {
		return nil
	}
	if err := s.c.Close(); err != nil {
		return fmt.Errorf("redisstore: close: %w", err)
	}
	return nil
}

// begin checks that a call may start.
func (s *Store) begin(ctx context.Context) error {
	if s.closed.Load() {
		return persistence.ErrClosed
	}
	return ctx.Err()
}

// wrap annotates an error of an operation, turning the client's own
// "closed" error into persistence.ErrClosed once Close has begun.
func (s *Store) wrap(op string, err error) error {
	if s.closed.Load() && errors.Is(err, redis.ErrClosed) {
		err = persistence.ErrClosed
	}
	return fmt.Errorf("redisstore: %s: %w", op, err)
}

func epochArg(e persistence.Epoch) string { return strconv.FormatUint(e, 10) }

// run runs a script: EVALSHA, and EVAL when Redis does not have it cached
// (after a restart or SCRIPT FLUSH), which also caches it again.
func run(ctx context.Context, c redis.Scripter, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmd := sc.EvalSha(ctx, c, keys, args...)
	if isNoScript(cmd.Err()) {
		return sc.Eval(ctx, c, keys, args...)
	}
	return cmd
}

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }

// layout returns the store's layout version, reading it (and recording
// the newest in a new store) at the first call that needs it before
// CheckGroups told it.
func (s *Store) layout(ctx context.Context) (uint32, error) {
	if f := s.format.Load(); f != 0 {
		return f, nil
	}
	v, err := run(ctx, s.c, adoptFormatScript, []string{s.k.meta()}, formatVersion).Text()
	if err != nil {
		return 0, err
	}
	f, err := s.knownFormat(v)
	if err != nil {
		return 0, err
	}
	s.format.Store(f)
	return f, nil
}

// knownFormat parses a recorded layout version, refusing one this build
// does not know.
func (s *Store) knownFormat(v any) (uint32, error) {
	f, err := strconv.ParseUint(fmt.Sprint(v), 10, 32)
	if err != nil || f < 1 || f > formatVersion {
		return 0, fmt.Errorf("%s has layout version %v; this build knows 1 to %d: %w", s.k.meta(), v, formatVersion, persistence.ErrIncompatible)
	}
	return uint32(f), nil
}

// Claim bumps the group's epoch and returns its state.
func (s *Store) Claim(ctx context.Context, group uint32) (persistence.GroupState, error) {
	op := "claim group " + strconv.FormatUint(uint64(group), 10)
	if err := s.begin(ctx); err != nil {
		return persistence.GroupState{}, s.wrap(op, err)
	}
	f, err := s.layout(ctx)
	if err != nil {
		return persistence.GroupState{}, s.wrap(op, err)
	}
	var v []uint64
	if f >= minEpochLogFormat {
		v, err = s.claimEpochLog(ctx, group)
	} else {
		v, err = run(ctx, s.c, claimScript, []string{s.k.groupMeta(group)}).Uint64Slice()
	}
	if err != nil {
		return persistence.GroupState{}, s.wrap(op, err)
	}
	if len(v) != 3 {
		return persistence.GroupState{}, s.wrap(op, fmt.Errorf("unexpected reply %v", v))
	}
	s.lastMu.Lock()
	s.last[group] = v[2]
	s.lastMu.Unlock()
	return persistence.GroupState{Epoch: v[0], Checkpoint: v[1], Last: v[2]}, nil
}

// claimEpochLog claims a group of format 3: the script moves the log of
// the epoch it expects, so it names that epoch, read first, and is called
// again if another claim came in between (after a pause from the second
// time on: a client that reads from replicas may read a lagging epoch).
func (s *Store) claimEpochLog(ctx context.Context, group uint32) ([]uint64, error) {
	meta := s.k.groupMeta(group)
	pause := time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(pause):
			}
			pause = min(2*pause, 100*time.Millisecond)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e, err := s.epoch(ctx, group)
		if err != nil {
			return nil, err
		}
		v, err := run(ctx, s.c, claimScript3, []string{meta, s.k.epochLog(group, e), s.k.epochLog(group, e+1)}, epochArg(e)).Int64Slice()
		if err != nil {
			return nil, err
		}
		if len(v) == 1 && v[0] == -1 {
			continue // claimed meanwhile
		}
		out := make([]uint64, len(v))
		for i, x := range v {
			if x < 0 {
				return nil, fmt.Errorf("unexpected reply %v", v)
			}
			out[i] = uint64(x)
		}
		return out, nil
	}
}

// epoch reads a group's current epoch (0 before its first claim).
func (s *Store) epoch(ctx context.Context, group uint32) (persistence.Epoch, error) {
	v, err := s.c.HGet(ctx, s.k.groupMeta(group), "epoch").Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	e, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s has epoch %q", s.k.groupMeta(group), v)
	}
	return e, nil
}

// Append appends the records of each group, all groups in one round trip
// (with a Redis Cluster client, one per node involved): in format 3 an
// XADD per group in one MULTI/EXEC (a pipeline on a cluster), or a script
// when a group has several records or no known position; in formats 1 and
// 2 one script call for all groups (one per group on a cluster).
//
// Whether a call that failed on the network reached Redis is not known; its
// entries get position 0 and the error says so.
func (s *Store) Append(ctx context.Context, entries []persistence.Entry) ([]persistence.Position, error) {
	pos := make([]persistence.Position, len(entries))
	if err := s.begin(ctx); err != nil {
		return pos, s.wrap("append", err)
	}
	if len(entries) == 0 {
		return pos, nil
	}
	f, err := s.layout(ctx)
	if err != nil {
		return pos, s.wrap("append", err)
	}
	epochLog := f >= minEpochLogFormat
	// One call per group, its records in slice order.
	type call struct {
		group   uint32
		epoch   persistence.Epoch
		entries []int // indexes into entries
		cmd     *redis.Cmd
		last    int64 // the script's result
		err     error
	}
	var calls []*call
	byGroup := make(map[uint32]*call)
	for i, e := range entries {
		c := byGroup[e.Group]
		if c == nil {
			c = &call{group: e.Group, epoch: e.Epoch}
			byGroup[e.Group] = c
			calls = append(calls, c)
		}
		c.entries = append(c.entries, i)
	}
	// Lock the groups in ascending order: calls on overlapping groups
	// cannot deadlock.
	slices.SortFunc(calls, func(a, b *call) int { return cmp.Compare(a.group, b.group) })
	locks := make([]*sync.Mutex, len(calls))
	for i, c := range calls {
		mu, ok := s.appending.Load(c.group)
		if !ok {
			mu, _ = s.appending.LoadOrStore(c.group, new(sync.Mutex))
		}
		locks[i] = mu.(*sync.Mutex)
		locks[i].Lock()
	}
	defer func() {
		for _, mu := range locks {
			mu.Unlock()
		}
	}()
	s.lastMu.Lock()
	// The last position of each group this store claimed; expect gives it
	// as the scripts take it ("" for a group it did not claim: any).
	known := make(map[uint32]persistence.Position, len(calls))
	for _, c := range calls {
		if last, ok := s.last[c.group]; ok {
			known[c.group] = last
		}
	}
	s.lastMu.Unlock()
	expect := func(group uint32) string {
		if last, ok := known[group]; ok {
			return strconv.FormatUint(last, 10)
		}
		return ""
	}
	// A group's keys and arguments: in format 3 the log of its epoch, and
	// its expected last position; before, its meta and log, its epoch and
	// expected last position. For the call of several groups, how many
	// records follow; then its records.
	groupKeys := func(k []string, c *call) []string {
		if epochLog {
			return append(k, s.k.epochLog(c.group, c.epoch))
		}
		return append(k, s.k.groupMeta(c.group), s.k.log(c.group))
	}
	args := func(a []any, c *call, counted bool) []any {
		if !epochLog {
			a = append(a, epochArg(c.epoch))
		}
		a = append(a, expect(c.group))
		if counted {
			a = append(a, len(c.entries))
		}
		for _, i := range c.entries {
			a = append(a, entries[i].Data)
		}
		return a
	}
	one, many := appendScript, appendManyScript
	if epochLog {
		one, many = appendScript3, appendManyScript3
	}

	switch {
	case epochLog && !slices.ContainsFunc(calls, func(c *call) bool { _, ok := known[c.group]; return len(c.entries) > 1 || !ok }):
		// Format 3, one record per group at a known position (every
		// commit of the host): one XADD NOMKSTREAM per group, no script.
		// Each XADD is conditional on its own (a missing log is fenced; a
		// position taken already refuses the ID), and without Lua's copies
		// of the records Redis spends a third less per event
		// (BenchmarkAppend). On a single Redis in one MULTI/EXEC, so that
		// Redis syncs them once (a plain pipeline's commands would be read
		// and synced in several turns of its event loop); on a Redis
		// Cluster, where a transaction holds one slot, a plain pipeline
		// (go-redis sends each node its share).
		pipelined := s.c.TxPipelined
		if s.cluster {
			pipelined = s.c.Pipelined
		}
		// Format 4 compresses the records (records.go).
		var enc recordEncoder
		compress := f >= minCompressedLogFormat
		if compress {
			n := 0
			for _, c := range calls {
				n += encodedLen(len(entries[c.entries[0]].Data))
			}
			enc.reserve(n)
			defer enc.release() // (once the commands are answered)
		}
		cmds := make([]*redis.Cmd, len(calls))
		_, _ = pipelined(ctx, func(p redis.Pipeliner) error {
			for i, c := range calls {
				field, value := fieldRecord, entries[c.entries[0]].Data
				if compress {
					field, value = enc.encode(value)
				}
				cmds[i] = p.Do(ctx, "xadd", s.k.epochLog(c.group, c.epoch), "nomkstream", streamID(known[c.group]+1), field, value)
			}
			return nil
		})
		for i, c := range calls {
			c.last, c.err = xaddResult(cmds[i], known[c.group]+1)
		}
	case s.cluster:
		// A script may touch one slot only: one call per group, pipelined
		// (go-redis sends each node its share).
		_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range calls {
				c.cmd = one.EvalSha(ctx, p, groupKeys(nil, c), args(nil, c, false)...)
			}
			return nil
		})
		// A script Redis did not have cached did not run: send those again
		// with their source.
		if slices.ContainsFunc(calls, func(c *call) bool { return isNoScript(c.cmd.Err()) }) {
			_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, c := range calls {
					if isNoScript(c.cmd.Err()) {
						c.cmd = one.Eval(ctx, p, groupKeys(nil, c), args(nil, c, false)...)
					}
				}
				return nil
			})
		}
		for _, c := range calls {
			c.last, c.err = c.cmd.Int64()
		}
	default:
		// One call for every group: twice the records/s of a call per
		// group, at half the Redis CPU per record (BenchmarkAppend).
		keys := make([]string, 0, 2*len(calls))
		argv := make([]any, 0, 4*len(calls)+len(entries))
		for _, c := range calls {
			keys = groupKeys(keys, c)
			argv = args(argv, c, true)
		}
		res, err := run(ctx, s.c, many, keys, argv...).Int64Slice()
		if err == nil && len(res) != len(calls) {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		for i, c := range calls {
			if c.err = err; err == nil {
				c.last = res[i]
			}
		}
	}

	// Failed groups are reported by kind, each kind with its first error:
	// when Redis is down every group fails the same way.
	var fenced, unknown []uint32
	var unknownErr error
	s.lastMu.Lock()
	defer s.lastMu.Unlock()
	for _, c := range calls {
		last, err := c.last, c.err
		switch {
		case err == nil && last == -2:
			err = fmt.Errorf("the log is not at position %s: an earlier append whose outcome was unknown landed, or this call was sent twice; claim the group again", expect(c.group))
		case err == nil && last != -1 && last < int64(len(c.entries)):
			err = fmt.Errorf("unexpected reply %d", last)
		}
		switch {
		case err == nil && last == -1:
			fenced = append(fenced, c.group)
		case err != nil:
			// A network error may hit one group and not another: the
			// positions of the groups with replies stay valid.
			unknown = append(unknown, c.group)
			if unknownErr == nil {
				unknownErr = err
			}
		default:
			first := persistence.Position(last) - persistence.Position(len(c.entries)) + 1
			for k, i := range c.entries {
				pos[i] = first + persistence.Position(k)
			}
			if _, ok := s.last[c.group]; ok {
				s.last[c.group] = persistence.Position(last)
			}
		}
	}
	var errs []error
	if len(unknown) > 0 {
		errs = append(errs, s.wrap("append "+groupList(unknown), fmt.Errorf("outcome unknown: %w", unknownErr)))
	}
	if len(fenced) > 0 {
		errs = append(errs, s.wrap("append "+groupList(fenced), persistence.ErrFenced))
	}
	return pos, errors.Join(errs...)
}

// xaddResult turns the reply of a format 3 append's XADD NOMKSTREAM of
// position pos into what its script would return: pos, -1 for no log (the
// epoch is not current), -2 for a position taken already.
func xaddResult(cmd *redis.Cmd, pos persistence.Position) (int64, error) {
	id, err := cmd.Text()
	switch {
	case errors.Is(err, redis.Nil):
		return -1, nil
	case err != nil && isRedisError(err) && strings.Contains(err.Error(), "equal or smaller"):
		return -2, nil
	case err != nil:
		return 0, err
	case id != streamID(pos):
		return 0, fmt.Errorf("XADD of position %d added ID %s", pos, id)
	}
	return int64(pos), nil
}

// isRedisError reports whether err is an error reply of Redis (not one of
// the network or the client).
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// groupList names groups for an error message, eliding long lists.
func groupList(groups []uint32) string {
	if len(groups) == 1 {
		return "group " + strconv.FormatUint(uint64(groups[0]), 10)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d groups (", len(groups))
	for i, g := range groups[:min(len(groups), 5)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatUint(uint64(g), 10))
	}
	if len(groups) > 5 {
		b.WriteString(", …")
	}
	b.WriteString(")")
	return b.String()
}

// Read reads the group's records after a position, a page at a time.
func (s *Store) Read(ctx context.Context, group uint32, after persistence.Position, fn func(persistence.Position, []byte) error) error {
	op := "read group " + strconv.FormatUint(uint64(group), 10)
	if err := s.begin(ctx); err != nil {
		return s.wrap(op, err)
	}
	f, err := s.layout(ctx)
	if err != nil {
		return s.wrap(op, err)
	}
	key := s.k.log(group)
	var epoch persistence.Epoch
	if f >= minEpochLogFormat {
		if epoch, err = s.epoch(ctx, group); err != nil {
			return s.wrap(op, err)
		}
		key = s.k.epochLog(group, epoch)
	}
	for after < 1<<63 {
		msgs, err := s.c.XRangeN(ctx, key, streamID(after+1), "+", s.page).Result()
		if err != nil {
			return s.wrap(op, err)
		}
		for _, m := range msgs {
			p, err := parseStreamID(m.ID)
			if err != nil {
				return s.wrap(op, err)
			}
			d, err := decodeRecord(m.Values)
			if err != nil {
				return s.wrap(op, fmt.Errorf("log entry %s: %w", m.ID, err))
			}
			if err := fn(p, d); err != nil {
				return err // fn's own error, as it is
			}
			after = p
		}
		if int64(len(msgs)) == s.page {
			continue
		}
		if f < minEpochLogFormat || epoch == 0 {
			return nil
		}
		// The end of the log, or of its name: a claim renames it (into
		// the same stream under the next epoch's name), and a read that
		// met the rename goes on from where it was under the new name.
		n, err := s.c.Exists(ctx, key).Result()
		if err != nil {
			return s.wrap(op, err)
		}
		if n == 1 {
			return nil
		}
		e, err := s.epoch(ctx, group)
		if err != nil {
			return s.wrap(op, err)
		}
		if e == epoch {
			return s.wrap(op, fmt.Errorf("the group's log %s is missing", key))
		}
		epoch, key = e, s.k.epochLog(group, e)
	}
	return nil
}

// Checkpoint appends the outputs, then writes the snapshots and timer index
// entries and advances the checkpoint in one atomic step: one script call
// in formats 1 and 2, a MULTI/EXEC under a WATCH in format 3
// (checkpointWatched).
//
// A pipeline's output log is in another Redis Cluster slot than the group,
// so no script can append to it and check the group's epoch at once: the
// outputs are appended first, with one XADD each, all pipelined in one
// round trip (one per node involved on a cluster). If an append fails the
// checkpoint fails without writing anything else; a checkpoint that fails or is
// fenced may still have appended its outputs, and its retry appends them
// again.
func (s *Store) Checkpoint(ctx context.Context, group uint32, epoch persistence.Epoch, d persistence.CheckpointData) error {
	op := "checkpoint group " + strconv.FormatUint(uint64(group), 10)
	if err := s.begin(ctx); err != nil {
		return s.wrap(op, err)
	}
	// Refused input appends no output either.
	if err := d.CheckIDs(); err != nil {
		return s.wrap(op, err)
	}
	f, err := s.layout(ctx)
	if err != nil {
		return s.wrap(op, err)
	}
	if f < minEpochLogFormat && (len(d.IDs) > 0 || d.DropIDsBefore > 0) {
		return s.wrap(op, fmt.Errorf("the store's format %d has no id index (format %d has)", f, minEpochLogFormat))
	}
	if err := s.appendOutputs(ctx, d.Outputs); err != nil {
		return s.wrap(op, err)
	}
	if f >= minEpochLogFormat {
		if err := s.checkpointWatched(ctx, group, epoch, d); err != nil {
			return s.wrap(op, err)
		}
		return nil
	}
	keys := make([]string, 3, 3+len(d.Snapshots))
	keys[0], keys[1], keys[2] = s.k.groupMeta(group), s.k.log(group), s.k.due(group)
	args := make([]any, 3, 3+len(d.Snapshots)+2*len(d.Timers))
	args[0], args[1] = epochArg(epoch), strconv.FormatUint(d.Through, 10)
	nset := 0
	for _, sn := range d.Snapshots {
		if sn.Data != nil {
			keys = append(keys, s.k.snapshot(group, sn.Key))
			args = append(args, sn.Data)
			nset++
		}
	}
	args[2] = nset
	for _, sn := range d.Snapshots {
		if sn.Data == nil {
			keys = append(keys, s.k.snapshot(group, sn.Key))
		}
	}
	for _, t := range d.Timers {
		args = append(args, t.Key, strconv.FormatInt(t.Due, 10))
	}
	r, err := run(ctx, s.c, checkpointScript, keys, args...).Int64()
	switch {
	case err != nil:
		return s.wrap(op, err)
	case r == -1:
		return s.wrap(op, persistence.ErrFenced)
	case r == -2:
		return s.wrap(op, fmt.Errorf("position %d is beyond the last one", d.Through))
	}
	return nil
}

// msetChunk bounds the snapshots of one MSET of a checkpoint, so that one
// command does not hold Redis for long (the script's bound: unpack takes
// 8,000 values).
const msetChunk = 1000

// maxCheckpointRaces bounds the checkpoints of a format 3 group that
// start again because its meta changed under their WATCH while its epoch
// stayed (another checkpoint of the group by the same owner).
const maxCheckpointRaces = 10

// checkpointWatched is Checkpoint's write in format 3, without a script:
// it WATCHes the group's meta, checks the epoch there and the position
// against the log's last, and writes in one MULTI/EXEC, which Redis does
// not run if a claim changed the meta since the WATCH (appends do not
// touch it in format 3). Redis then spends no Lua copies of the snapshots:
// in the script they cost Redis about as much as their MSET (INFO
// commandstats at a million keys, BENCHMARKS.md, session 33).
func (s *Store) checkpointWatched(ctx context.Context, group uint32, epoch persistence.Epoch, d persistence.CheckpointData) error {
	meta, log, due := s.k.groupMeta(group), s.k.epochLog(group, epoch), s.k.due(group)
	// wrote is set once the transaction ran: a Redis Cluster client's
	// Watch (go-redis v9.23) returns nil without calling write when it runs
	// out of redirections for the WATCH itself (MOVED and ASK while the
	// group's slot migrates), which must not pass for a checkpoint written.
	var wrote bool
	write := func(tx *redis.Tx) error {
		v, err := tx.HMGet(ctx, meta, "epoch", "checkpoint").Result()
		if err != nil {
			return err
		}
		if v[0] != epochArg(epoch) {
			return persistence.ErrFenced
		}
		checkpoint, err := metaPosition(v[1])
		if err != nil {
			return fmt.Errorf("%s has checkpoint %v", meta, v[1])
		}
		info, err := tx.XInfoStream(ctx, log).Result()
		if err != nil {
			if isRedisError(err) && strings.Contains(err.Error(), "no such key") {
				return persistence.ErrFenced // claimed since the HMGET
			}
			return err
		}
		last, err := parseStreamPos(info.LastGeneratedID)
		if err != nil {
			return err
		}
		if d.Through > last {
			return fmt.Errorf("position %d is beyond the last one", d.Through)
		}
		var dropped []string
		if d.DropIDsBefore > 0 {
			bs, err := tx.ZRangeArgs(ctx, redis.ZRangeArgs{Key: s.k.idBuckets(group), ByScore: true, Start: "-inf", Stop: "(" + strconv.FormatInt(d.DropIDsBefore, 10)}).Result()
			if err != nil {
				return err
			}
			for _, b := range bs {
				n, err := strconv.ParseInt(b, 10, 64)
				if err != nil {
					return fmt.Errorf("%s holds bucket %q", s.k.idBuckets(group), b)
				}
				dropped = append(dropped, s.k.idBucket(group, n))
			}
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(dropped) > 0 {
				p.Del(ctx, dropped...)
				p.ZRemRangeByScore(ctx, s.k.idBuckets(group), "-inf", "("+strconv.FormatInt(d.DropIDsBefore, 10))
			}
			s.storeIDs(ctx, p, group, d.IDs)
			kv := make([]any, 0, 2*min(msetChunk, len(d.Snapshots)))
			var dels []string
			for _, sn := range d.Snapshots {
				if sn.Data == nil {
					dels = append(dels, s.k.snapshot(group, sn.Key))
					continue
				}
				if kv = append(kv, s.k.snapshot(group, sn.Key), sn.Data); len(kv) == 2*msetChunk {
					p.MSet(ctx, kv...)
					kv = make([]any, 0, 2*msetChunk)
				}
			}
			if len(kv) > 0 {
				p.MSet(ctx, kv...)
			}
			if len(dels) > 0 {
				p.Del(ctx, dels...)
			}
			for _, t := range d.Timers {
				if t.Due == 0 {
					p.ZRem(ctx, due, t.Key)
				} else {
					p.ZAdd(ctx, due, redis.Z{Score: float64(t.Due), Member: t.Key})
				}
			}
			if d.Through > checkpoint {
				p.HSet(ctx, meta, "checkpoint", strconv.FormatUint(d.Through, 10))
				p.XTrimMinID(ctx, log, streamID(d.Through+1))
			}
			return nil
		})
		wrote = err == nil
		return err
	}
	for range maxCheckpointRaces {
		wrote = false
		err := s.c.Watch(ctx, write, meta)
		if err == nil && !wrote {
			return errors.New("the checkpoint's transaction did not run: the client gave up on the redirections of its WATCH (the group's Redis Cluster slot is migrating?)")
		}
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("the group's meta changed under %d checkpoints in a row", maxCheckpointRaces)
}

// storeIDs queues the writes of ids to a group's id index: per bucket one
// HSET, its member in the zset of buckets, and its expiry at the latest of
// its ids' (PEXPIREAT NX sets it on a new hash, GT only raises it: GT alone
// never sets one, a hash without an expiry counting as one that never
// expires).
func (s *Store) storeIDs(ctx context.Context, p redis.Pipeliner, group uint32, ids []persistence.StoredID) {
	if len(ids) == 0 {
		return
	}
	type bucket struct {
		fields  []any
		expires int64
		forever bool
	}
	byBucket := map[int64]*bucket{}
	var order []int64
	for _, id := range ids {
		b := byBucket[id.Bucket]
		if b == nil {
			b = &bucket{}
			byBucket[id.Bucket] = b
			order = append(order, id.Bucket)
		}
		b.fields = append(b.fields, idField(id.Key, id.ID), strconv.FormatInt(id.At, 10))
		if id.Expires == 0 {
			b.forever = true
		}
		b.expires = max(b.expires, id.Expires)
	}
	for _, n := range order {
		b, key := byBucket[n], s.k.idBucket(group, n)
		p.HSet(ctx, key, b.fields...)
		p.ZAdd(ctx, s.k.idBuckets(group), redis.Z{Score: float64(n), Member: strconv.FormatInt(n, 10)})
		if b.forever {
			p.Persist(ctx, key)
			continue
		}
		// (go-redis has no ExpireAt with a flag.)
		p.Do(ctx, "PEXPIREAT", key, b.expires, "NX")
		p.Do(ctx, "PEXPIREAT", key, b.expires, "GT")
	}
}

// LookupIDs returns the times the ids were stored with in the group's id
// index (0: not held), with one HGET each, pipelined in one round trip.
func (s *Store) LookupIDs(ctx context.Context, group uint32, lookups []persistence.IDLookup) ([]int64, error) {
	op := "look up ids of group " + strconv.FormatUint(uint64(group), 10)
	if err := persistence.CheckIDLookups(lookups); err != nil {
		return nil, s.wrap(op, err)
	}
	if err := s.begin(ctx); err != nil {
		return nil, s.wrap(op, err)
	}
	at := make([]int64, len(lookups))
	if len(lookups) == 0 {
		return at, nil
	}
	cmds := make([]*redis.StringCmd, len(lookups))
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, l := range lookups {
			cmds[i] = p.HGet(ctx, s.k.idBucket(group, l.Bucket), idField(l.Key, l.ID))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, s.wrap(op, err)
	}
	for i, c := range cmds {
		v, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err == nil {
			at[i], err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			return nil, s.wrap(op, fmt.Errorf("id %q of key %q: %w", lookups[i].ID, lookups[i].Key, err))
		}
	}
	return at, nil
}

// metaPosition parses a position field of a group's meta (nil: 0).
func metaPosition(v any) (persistence.Position, error) {
	if v == nil {
		return 0, nil
	}
	return strconv.ParseUint(fmt.Sprint(v), 10, 64)
}

// parseStreamPos returns the position of a format 3 log's last generated
// ID, n-0 (0-1 in a log that never had a record).
func parseStreamPos(id string) (persistence.Position, error) {
	ms, _, ok := strings.Cut(id, "-")
	pos, err := strconv.ParseUint(ms, 10, 64)
	if !ok || err != nil {
		return 0, errBadID(id)
	}
	return pos, nil
}

// Timers calls fn with the group's timer index entries in due order (keys
// of one due in byte order), reading a page of ReadPageSize entries per
// round trip. The view is consistent only if no checkpoint of the group
// runs meanwhile (as when a new owner reads the index after its claim,
// before its first checkpoint): one could move entries across pages.
func (s *Store) Timers(ctx context.Context, group uint32, fn func(key string, due int64) error) error {
	op := "timers of group " + strconv.FormatUint(uint64(group), 10)
	if err := s.begin(ctx); err != nil {
		return s.wrap(op, err)
	}
	key := s.k.due(group)
	for start := int64(0); ; start += s.page {
		zs, err := s.c.ZRangeWithScores(ctx, key, start, start+s.page-1).Result()
		if err != nil {
			return s.wrap(op, err)
		}
		for _, z := range zs {
			k, ok := z.Member.(string)
			if !ok {
				return s.wrap(op, fmt.Errorf("unexpected timer member %T", z.Member))
			}
			if err := fn(k, int64(z.Score)); err != nil {
				return err // fn's own error, as it is
			}
		}
		if int64(len(zs)) < s.page {
			return nil
		}
	}
}

// Get returns a key's snapshot.
func (s *Store) Get(ctx context.Context, group uint32, key string) ([]byte, error) {
	op := fmt.Sprintf("get group %d key %q", group, key)
	if err := s.begin(ctx); err != nil {
		return nil, s.wrap(op, err)
	}
	b, err := s.c.Get(ctx, s.k.snapshot(group, key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, s.wrap(op, persistence.ErrNotFound)
	}
	if err != nil {
		return nil, s.wrap(op, err)
	}
	return b, nil
}

// GetMany returns several snapshots with one MGET (the keys of a group
// share a slot, so this works on a cluster too).
func (s *Store) GetMany(ctx context.Context, group uint32, keys []string) ([][]byte, error) {
	op := "get group " + strconv.FormatUint(uint64(group), 10)
	if err := s.begin(ctx); err != nil {
		return nil, s.wrap(op, err)
	}
	out := make([][]byte, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	vals, err := s.c.MGet(ctx, s.snapshotNames(group, keys)...).Result()
	if err != nil {
		return nil, s.wrap(op, err)
	}
	if err := snapshotValues(out, vals, keys); err != nil {
		return nil, s.wrap(op, err)
	}
	return out, nil
}

// snapshotNames returns the Redis keys of a group's snapshots.
func (s *Store) snapshotNames(group uint32, keys []string) []string {
	rkeys := make([]string, len(keys))
	for i, k := range keys {
		rkeys[i] = s.k.snapshot(group, k)
	}
	return rkeys
}

// snapshotValues sets out[i] to the snapshot in vals[i], an MGET's reply
// for keys[i] (nil for none).
func snapshotValues(out [][]byte, vals []any, keys []string) error {
	for i, v := range vals {
		switch v := v.(type) {
		case nil:
		case string:
			out[i] = []byte(v)
		default:
			return fmt.Errorf("unexpected reply %T for key %q", v, keys[i])
		}
	}
	return nil
}

// GetGroups returns the snapshots of keys of several groups with one MGET
// per group, pipelined: one round trip (per Redis Cluster node).
func (s *Store) GetGroups(ctx context.Context, reads []persistence.GroupKeys) ([][][]byte, error) {
	const op = "get groups"
	if err := s.begin(ctx); err != nil {
		return nil, s.wrap(op, err)
	}
	out := make([][][]byte, len(reads))
	n := 0
	for _, r := range reads {
		n += len(r.Keys)
	}
	all := make([][]byte, n) // every group's values, in one allocation
	cmds := make([]*redis.SliceCmd, len(reads))
	pipe := s.c.Pipeline()
	for i, r := range reads {
		out[i], all = all[:len(r.Keys):len(r.Keys)], all[len(r.Keys):]
		if len(r.Keys) == 0 {
			continue
		}
		cmds[i] = pipe.MGet(ctx, s.snapshotNames(r.Group, r.Keys)...)
	}
	if pipe.Len() == 0 {
		return out, nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, s.wrap(op, err)
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		if err := snapshotValues(out[i], cmd.Val(), reads[i].Keys); err != nil {
			return nil, s.wrap(op, fmt.Errorf("group %d: %w", reads[i].Group, err))
		}
	}
	return out, nil
}

// PackedSnapshots reports whether the store allows packed snapshots
// (persistence.PackedSnapshots): whether CheckGroups found it at format 2
// or above (every store it creates is; one created at format 1 stays so).
func (s *Store) PackedSnapshots() bool { return s.packed.Load() }

// IDIndex reports whether the store's format keeps an id index (3 and
// later), once CheckGroups has read it (persistence.IDIndexer).
func (s *Store) IDIndex() bool { return s.format.Load() >= minEpochLogFormat }

// RecordedGroups returns the number of key groups the store records (0:
// none yet) (persistence.GroupsRecorder).
func (s *Store) RecordedGroups(ctx context.Context) (uint32, error) {
	if err := s.begin(ctx); err != nil {
		return 0, s.wrap("recorded groups", err)
	}
	v, err := s.c.HGet(ctx, s.k.meta(), "groups").Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, s.wrap("recorded groups", err)
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, s.wrap("recorded groups", fmt.Errorf("%s has key groups %q", s.k.meta(), v))
	}
	return uint32(n), nil
}

// CheckGroups records the layout version, number of key groups and key-group
// layout in a new store and checks the first two in an existing one,
// returning its key-group layout.
func (s *Store) CheckGroups(ctx context.Context, groups, layout uint32) (uint32, error) {
	if groups == 0 {
		return 0, errors.New("redisstore: check groups: the number of key groups must be positive")
	}
	if err := s.begin(ctx); err != nil {
		return 0, s.wrap("check groups", err)
	}
	v, err := run(ctx, s.c, checkGroupsScript, []string{s.k.meta()}, formatVersion, groups, layout).Slice()
	if err != nil {
		return 0, s.wrap("check groups", err)
	}
	if len(v) != 3 {
		return 0, s.wrap("check groups", fmt.Errorf("unexpected reply %q", v))
	}
	f, err := s.knownFormat(v[0])
	if err != nil {
		return 0, s.wrap("check groups", err)
	}
	s.format.Store(f)
	s.packed.Store(f >= minPackedFormat)
	if v[1] != strconv.FormatUint(uint64(groups), 10) {
		return 0, s.wrap("check groups", fmt.Errorf("%d, the store has %v: %w", groups, v[1], persistence.ErrGroupsMismatch))
	}
	if v[2] == nil {
		return 0, nil // created before the key-group layout was recorded
	}
	stored, err := strconv.ParseUint(fmt.Sprint(v[2]), 10, 32)
	if err != nil {
		return 0, s.wrap("check groups", fmt.Errorf("%s has key-group layout %q", s.k.meta(), v[2]))
	}
	return uint32(stored), nil
}
