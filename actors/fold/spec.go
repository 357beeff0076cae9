package fold

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
)

// DefaultDedupWindow is how long an event id is remembered when a pipeline
// names an id field but no dedup_window.
const DefaultDedupWindow = 24 * time.Hour

// Defaults of the event-time settings.
const (
	DefaultIdleTimeout     = 30 * time.Second
	DefaultOutputRetention = 24 * time.Hour
)

// Bounds of the window settings: MaxSlidingRatio bounds size/slide (each
// event joins that many windows), MaxWindowSpan any duration.
const (
	MaxSlidingRatio = 100
	MaxWindowSpan   = 366 * 24 * time.Hour
)

// Spec is the configuration of one pipeline, as written in YAML.
type Spec struct {
	// Key is the (dotted) field whose value names the key's actor. The value
	// must be a string or a number.
	Key string `yaml:"key"`
	// Time is the event-time field (RFC 3339 string or Unix milliseconds).
	// Empty means event time is ingest time.
	Time string `yaml:"time"`
	// ID is the idempotency field: an event whose id was already applied to
	// its key within DedupWindow is a duplicate and changes nothing.
	ID string `yaml:"id"`
	// DedupWindow is how long applied ids are remembered (default 24h).
	DedupWindow time.Duration `yaml:"dedup_window"`
	// Aggregates are the running aggregates of each key, by name.
	Aggregates map[string]AggregateSpec `yaml:"aggregates"`
	// Windows are the event-time windows of each key, by name.
	Windows map[string]WindowSpec `yaml:"windows"`
	// Patterns are the event-time patterns each key detects, by name.
	Patterns map[string]PatternSpec `yaml:"patterns"`
	// OutOfOrderness is how far the watermark trails the largest event time
	// seen: events up to this much older than the newest are on time.
	OutOfOrderness time.Duration `yaml:"out_of_orderness"`
	// AllowedLateness keeps windows after they emitted: an event this much
	// behind the watermark still updates its window, which emits again
	// (the next revision). Later events are dropped and counted.
	AllowedLateness time.Duration `yaml:"allowed_lateness"`
	// IdleTimeout is how long the pipeline may receive no events before its
	// watermark starts advancing with processing time (so quiet keys close
	// their windows). Default 30s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// OutputRetention is how long emitted results are kept in the
	// pipeline's output log. Default 24h.
	OutputRetention time.Duration `yaml:"output_retention"`
	// TTL deletes the state of keys that received no event for this long,
	// by processing time (0: keep keys forever).
	TTL time.Duration `yaml:"ttl"`
	// Handler, if set, is the pipeline's Go handler (see handler.go;
	// package keyfold's Handle sets it). It is not configured in YAML.
	Handler Handler `yaml:"-"`
}

// WindowSpec is one event-time window of each key.
type WindowSpec struct {
	// Type is tumbling, sliding or session.
	Type string `yaml:"type"`
	// Size is the length of tumbling and sliding windows.
	Size time.Duration `yaml:"size"`
	// Slide is how often a sliding window starts; Size must be a multiple.
	Slide time.Duration `yaml:"slide"`
	// Gap closes a session after this much event time without events.
	Gap time.Duration `yaml:"gap"`
	// Aggregates names the pipeline's aggregates the window computes
	// (default: all of them).
	Aggregates []string `yaml:"aggregates"`
}

// AggregateSpec is one running aggregate.
type AggregateSpec struct {
	// Op is one of count, sum, min, max, last, distinct, quantiles.
	Op string `yaml:"op"`
	// Field is the (dotted) field the op reads; required except for count,
	// which with a field counts the events where the field is present.
	Field string `yaml:"field"`
	// Where, if set, is an expression over the event's fields: only events
	// for which it is true contribute (see the README for the language).
	Where string `yaml:"where"`
}

// Op is an aggregate operation.
type Op uint8

// The aggregate operations.
const (
	OpCount Op = iota + 1
	OpSum
	OpMin
	OpMax
	OpLast
	OpDistinct  // estimated number of distinct values (HyperLogLog)
	OpQuantiles // estimated p50, p90, p99 (DDSketch)
)

var opNames = map[string]Op{
	"count": OpCount, "sum": OpSum, "min": OpMin, "max": OpMax, "last": OpLast,
	"distinct": OpDistinct, "quantiles": OpQuantiles,
}

// opStrings are the names of opNames by op: String runs for every
// aggregate of every snapshot encoded (a search of the map was a third of
// encoding one, BENCHMARKS.md session 11).
var opStrings = func() (names [OpQuantiles + 1]string) {
	for name, op := range opNames {
		names[op] = name
	}
	return names
}()

func (o Op) String() string {
	if int(o) < len(opStrings) && opStrings[o] != "" {
		return opStrings[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// numeric reports whether the op needs a numeric field.
func (o Op) numeric() bool { return o == OpSum || o == OpMin || o == OpMax || o == OpQuantiles }

// Pipeline is a compiled Spec. It is immutable and safe for concurrent use.
type Pipeline struct {
	name        string
	key         []string // dotted paths, split
	keyField    string
	timeField   string
	time        []string
	idField     string
	id          []string
	dedupWindow time.Duration
	aggs        []aggregate // sorted by name
	ops         []Op        // the aggregates' (a key's aggSet is parallel to them)
	windows     []window    // sorted by name
	patterns    []pattern   // sorted by name
	steps       []*where    // the patterns' filters, in order
	ooo         int64       // out_of_orderness, ms
	lateness    int64       // allowed_lateness, ms
	idle        int64       // idle_timeout, ms
	retention   time.Duration
	ttl         int64 // ms; 0: none
	handler     Handler
	join        *join // for a join's keys (join.go)

	// What Prepare reads of an event (scan.go): the top-level members, and
	// where each field is found among them.
	reads                  []string
	keyRef, idRef, timeRef fieldRef
	aggRefs                []fieldRef // by aggregate
	envReads               []int      // the members the filters name
	dynamicEnv             bool       // a filter may read any member
	hasFilters             bool
	needsEnv               bool // a filter is evaluated on the members decoded (filterEnv), not only textEq ones

	fingerprint uint64 // see Fingerprint
	shape       []byte // see Shape
	shapeID     uint64
}

type aggregate struct {
	name  string
	op    Op
	field string
	path  []string
	where *where
}

// Compile validates spec and compiles it into a Pipeline. It reports every
// problem at once, each as a *SpecError naming the pipeline and the entry.
func Compile(name string, spec Spec) (*Pipeline, error) {
	var errs []error
	bad := func(entry, format string, args ...any) {
		errs = append(errs, &SpecError{Pipeline: name, Entry: entry, Problem: fmt.Sprintf(format, args...)})
	}
	if name == "" || strings.ContainsFunc(name, func(r rune) bool { return r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) }) {
		bad("", "name must be non-empty and contain no '/', whitespace or control characters")
	}
	if spec.Key == "" {
		bad("key", "is required (the field that names each key)")
	}
	if spec.DedupWindow < 0 || (spec.DedupWindow > 0 && spec.DedupWindow < time.Millisecond) {
		bad("dedup_window", "must be at least 1ms (got %v)", spec.DedupWindow)
	}
	if spec.DedupWindow == 0 {
		spec.DedupWindow = DefaultDedupWindow
	}
	p := &Pipeline{
		name:        name,
		keyField:    spec.Key,
		key:         splitPath(spec.Key),
		timeField:   spec.Time,
		time:        splitPath(spec.Time),
		idField:     spec.ID,
		id:          splitPath(spec.ID),
		dedupWindow: spec.DedupWindow,
		handler:     spec.Handler,
	}
	names := make([]string, 0, len(spec.Aggregates))
	for n := range spec.Aggregates {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := spec.Aggregates[n]
		entry := "aggregates." + n
		op, ok := opNames[a.Op]
		switch {
		case a.Op == "":
			bad(entry, "op is required (one of %s)", opList())
			continue
		case !ok:
			bad(entry, "unknown op %q (want one of %s)", a.Op, opList())
			continue
		}
		if op != OpCount && a.Field == "" {
			bad(entry, "op %s needs a field", op)
		}
		agg := aggregate{name: n, op: op, field: a.Field, path: splitPath(a.Field)}
		if a.Where != "" {
			prog, err := compileWhere(a.Where)
			if err != nil {
				bad(entry, "where %q does not compile: %v", a.Where, firstLine(err))
			}
			agg.where = prog
		}
		p.aggs = append(p.aggs, agg)
		p.ops = append(p.ops, op)
	}
	p.compileTime(spec, bad)
	p.compilePatterns(spec, bad)
	p.compileTTL(spec, bad)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	p.indexFields()
	p.fingerprint = fingerprintOf(name, spec)
	p.compileShape()
	return p, nil
}

func opList() string {
	names := make([]string, 0, len(opNames))
	for n := range opNames {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// Name returns the pipeline's name.
func (p *Pipeline) Name() string { return p.name }

// DedupWindow returns how long applied ids are remembered.
func (p *Pipeline) DedupWindow() time.Duration { return p.dedupWindow }

func splitPath(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}
