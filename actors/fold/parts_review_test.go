package fold_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/keyfold/keyfold/actors/fold"
)

func idEv(t testing.TB, p *fold.Pipeline, id string) *fold.Event {
	return prepare(t, p, fmt.Sprintf(`{"user_id":"a","event_id":%q}`, id))
}

func dedupPipeline(w time.Duration) *fold.Pipeline {
	spec := fuzzSpec
	spec.DedupWindow = w
	spec.Windows = nil
	p, err := fold.Compile("fuzz", spec)
	if err != nil {
		panic(err)
	}
	return p
}

// The tests below were written by an independent review of id bucket
// parts (it found that part 0 could be written as a deletion, after which
// the key could not be restored).

// A restore under a changed dedup window (a new bucket layout, written
// whole), then an event that expires 256 ids or more of the oldest new
// bucket: the snapshot that follows restores, and remembers the rest.
func TestPartsRewriteThenExpiry(t *testing.T) {
	p1, p2 := dedupPipeline(16*time.Second), dedupPipeline(8*time.Second)
	var s fold.State
	for i := range 1000 {
		p1.Apply(&s, idEv(t, p1, fmt.Sprint("e", i)), int64(i))
	}
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	parts, _ := p1.SnapshotParts(&s, 0)
	ps.store(parts)
	r := ps.restore(t, p2) // rewrite
	p2.Apply(&r, idEv(t, p2, "new"), 8300)
	parts, _ = p2.SnapshotParts(&r, fold.RestoredVersion)
	for _, b := range parts.Buckets {
		t.Logf("bucket %d part %d data %d bytes", b.Bucket, b.Part, len(b.Data))
	}
	ps.store(parts)
	t.Logf("core lists %v parts %v", ps.core.SeenBuckets, ps.core.SeenBucketParts)
	r2, err := p2.RestoreParts(ps.core, loadFrom(ps))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if !reflect.DeepEqual(stateProto(p2, &r2), stateProto(p2, &r)) {
		t.Fatal("differs")
	}
	for i := 301; i < 1000; i++ {
		if !p2.Apply(&r2, idEv(t, p2, fmt.Sprint("e", i)), 8300) {
			t.Fatalf("e%d not a duplicate", i)
		}
	}
}

// Checkpoints fail while a bucket's first 256 ids expire: the snapshot
// that finally stores restores.
func TestPartsFailuresAcrossExpiry(t *testing.T) {
	p := dedupPipeline(16 * time.Second)
	var s fold.State
	ps := &partsStore{buckets: map[bucketPart][]byte{}}
	for i := range 100 {
		p.Apply(&s, idEv(t, p, fmt.Sprint("e", i)), int64(i))
	}
	parts, _ := p.SnapshotParts(&s, 0)
	ps.store(parts)
	s.Persisted(parts.Version)
	stored := parts.Version
	for i := 100; i < 900; i++ {
		p.Apply(&s, idEv(t, p, fmt.Sprint("e", i)), int64(i))
		if i%100 == 0 {
			p.SnapshotParts(&s, stored) // failed checkpoint
		}
	}
	p.Apply(&s, idEv(t, p, "late"), 16000+400)
	parts, _ = p.SnapshotParts(&s, stored)
	ps.store(parts)
	s.Persisted(parts.Version)
	if _, err := p.RestoreParts(ps.core, loadFrom(ps)); err != nil {
		t.Fatalf("restore: %v", err)
	}
}

// A random walk over id bucket parts (buckets of about 500 ids): failed
// checkpoints, passivations, dedup window changes, erases, time gaps. After
// every stored snapshot the restored state equals the one in memory, and
// every stored part is one the core lists.
func TestPartsRandomWalk(t *testing.T) {
	pipes := []*fold.Pipeline{dedupPipeline(4 * time.Second), dedupPipeline(3 * time.Second), dedupPipeline(5 * time.Second)}
	seeds := uint64(24) // (60 were run when it was written)
	if raceDetector {
		seeds = 6
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			p := pipes[0]
			var s fold.State
			ps := &partsStore{buckets: map[bucketPart][]byte{}}
			stored := uint64(0)
			now := int64(0)
			next := 0
			multiSeen, rewrites := 0, 0
			defer func() { t.Logf("multi %d rewrites %d", multiSeen, rewrites) }()
			for i := range 30000 {
				now += rng.Int64N(2)
				if rng.IntN(300) == 0 {
					now += rng.Int64N(8000)
				}
				var id string
				if rng.IntN(4) == 0 && next > 0 {
					id = fmt.Sprint("e", next-1-rng.IntN(min(next, 3000)))
				} else {
					id = fmt.Sprint("e", next)
					next++
				}
				ev := idEv(t, p, id)
				if rng.IntN(3000) == 0 {
					ev = fold.Tombstone("a")
				}
				p.Apply(&s, ev, now)
				if rng.IntN(40) != 0 {
					continue
				}
				parts, err := p.SnapshotParts(&s, stored)
				if err != nil {
					t.Fatal(err)
				}
				if rng.IntN(3) == 0 {
					continue // failed
				}
				ps.store(parts)
				s.Persisted(parts.Version)
				stored = parts.Version
				if s.Empty() {
					ps.core = nil
				}
				// garbage: every stored part is listed
				listed := map[int64]int{}
				for bi, b := range ps.core.GetSeenBuckets() {
					n := 1
					if bi < len(ps.core.GetSeenBucketParts()) && ps.core.SeenBucketParts[bi] > 1 {
						n = int(ps.core.SeenBucketParts[bi])
					}
					listed[b] = n
				}
				for bp := range ps.buckets {
					if n, ok := listed[bp.bucket]; !ok || bp.part >= n {
						t.Fatalf("event %d: stored part %v not listed (core %v %v)", i, bp, ps.core.GetSeenBuckets(), ps.core.GetSeenBucketParts())
					}
				}
				if len(ps.core.GetSeenBucketParts()) > 0 {
					multiSeen++
				}
				r, err := p.RestoreParts(ps.core, loadFrom(ps))
				if err != nil {
					t.Fatalf("event %d: restore: %v", i, err)
				}
				if !s.Empty() && !reflect.DeepEqual(stateProto(p, &r), stateProto(p, &s)) {
					t.Fatalf("event %d: restored differs:\n%v\n%v", i, stateProto(p, &r), stateProto(p, &s))
				}
				if rng.IntN(3) == 0 { // passivation, maybe under a new window
					if rng.IntN(3) == 0 {
						p = pipes[rng.IntN(len(pipes))]
						rewrites++
						r, err = p.RestoreParts(ps.core, loadFrom(ps))
						if err != nil {
							t.Fatalf("event %d: restore under new window: %v", i, err)
						}
					}
					s, stored = r, min(r.Version(), fold.RestoredVersion)
					if rng.IntN(2) == 0 {
						now += rng.Int64N(5000) // it comes back later
					}
				}
			}
		})
	}
}
