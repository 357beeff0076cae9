package embedded_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/embedded"
)

// BenchmarkAppend appends batches of 2 KB records spread over 16 groups per
// call, each call one synced write, from one or several goroutines (on
// disjoint groups, so that Pebble can share a WAL sync among them).
func BenchmarkAppend(b *testing.B) {
	const (
		groups     = 16
		recordSize = 2 << 10
	)
	for _, perGroup := range []int{1, 16} {
		for _, workers := range []int{1, 4} {
			b.Run(fmt.Sprintf("records=%d/goroutines=%d", groups*perGroup, workers), func(b *testing.B) {
				ctx := b.Context()
				s := open(b, b.TempDir())
				defer s.Close()
				batches := make([][]persistence.Entry, workers)
				for w := range batches {
					for g := range uint32(groups) {
						g += uint32(w * groups)
						st, err := s.Claim(ctx, g)
						if err != nil {
							b.Fatal(err)
						}
						for range perGroup {
							data := make([]byte, recordSize)
							batches[w] = append(batches[w], persistence.Entry{Group: g, Epoch: st.Epoch, Data: data})
						}
					}
				}
				perCall := groups * perGroup
				b.SetBytes(int64(perCall * recordSize))
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for i := w; i < b.N; i += workers {
							if _, err := s.Append(ctx, batches[w]); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N*perCall)/b.Elapsed().Seconds(), "records/s")
			})
		}
	}
}

// BenchmarkGet reads snapshots that are in the memtable, one key a call:
// the read of a key's activation, where the store's own overhead shows most.
func BenchmarkGet(b *testing.B) {
	ctx := b.Context()
	s := open(b, b.TempDir())
	defer s.Close()
	st, err := s.Claim(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Append(ctx, []persistence.Entry{{Group: 1, Epoch: st.Epoch, Data: []byte("x")}}); err != nil {
		b.Fatal(err)
	}
	const keys = 1024
	var snaps []persistence.Snapshot
	for k := range keys {
		snaps = append(snaps, persistence.Snapshot{Key: fmt.Sprint(k), Data: make([]byte, 256)})
	}
	if err := s.Checkpoint(ctx, 1, st.Epoch, persistence.CheckpointData{Through: 1, Snapshots: snaps}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Get(ctx, 1, snaps[i%keys].Key); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckpoint writes a group's checkpoint as a million keys' load
// does: a thousand snapshots of 200 bytes, each with an id for the index
// (one synced write a call). allocs/op counts the store's own allocations.
func BenchmarkCheckpoint(b *testing.B) {
	ctx := b.Context()
	s := open(b, b.TempDir())
	defer s.Close()
	st, err := s.Claim(ctx, 0)
	if err != nil {
		b.Fatal(err)
	}
	var d persistence.CheckpointData
	at := int64(1_700_000_000_000)
	for k := range 1000 {
		key := fmt.Sprintf("logins\x00user-%07d", k)
		d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: key, Data: make([]byte, 200)})
		d.IDs = append(d.IDs, persistence.StoredID{Bucket: at / 60_000, Key: key, ID: fmt.Sprintf("event-%010d", k), At: at})
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Checkpoint(ctx, 0, st.Epoch, d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookupIDs looks up ids in an index of many level 0 tables, as a
// dedup window's flushes leave it (the id index is never compacted: a day
// at one flush a minute is 1,440 tables; a million keys under full load
// flushed about 12 a minute, 17,280 a day), each table a minute of 4,096
// ids: an id held (a table of the middle minute holds it) and one absent
// from a minute that has a table (its Bloom filter says no).
func BenchmarkLookupIDs(b *testing.B) {
	for _, tables := range []int{16, 1440, 17280} {
		b.Run(fmt.Sprintf("tables=%d", tables), func(b *testing.B) {
			ctx := b.Context()
			s := open(b, b.TempDir())
			defer s.Close()
			st, err := s.Claim(ctx, 3)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]persistence.StoredID, 4096)
			for m := range int64(tables) {
				for k := range ids {
					ids[k] = persistence.StoredID{Bucket: m, Key: fmt.Sprintf("user-%07d", k), ID: fmt.Sprintf("event-%d-%d", m, k), At: 1 + m}
				}
				if err := s.Checkpoint(ctx, 3, st.Epoch, persistence.CheckpointData{IDs: ids}); err != nil {
					b.Fatal(err)
				}
				if err := embedded.FlushIDIndex(s); err != nil {
					b.Fatal(err)
				}
			}
			if n := embedded.IDIndexTables(s); n < tables {
				b.Fatalf("%d tables, want at least %d", n, tables)
			}
			mid := int64(tables / 2)
			held := persistence.IDLookup{Bucket: mid, Key: "user-0000100", ID: fmt.Sprintf("event-%d-100", mid)}
			absent := persistence.IDLookup{Bucket: mid, Key: "user-0000100", ID: "never"}
			for _, c := range []struct {
				name string
				l    persistence.IDLookup
				want int64
			}{{"held", held, 1 + mid}, {"absent", absent, 0}} {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						at, err := s.LookupIDs(ctx, 3, []persistence.IDLookup{c.l})
						if err != nil || at[0] != c.want {
							b.Fatalf("LookupIDs = %v, %v; want %d", at, err, c.want)
						}
					}
				})
			}
		})
	}
}

// BenchmarkGetFromTables reads snapshots of random keys among 500,000 in
// the store's tables, with a block cache too small to hold them: the read
// of a key that left memory at ten million keys, where each read is a
// block from the file (in the page cache). "mapped" reads the tables
// through mappings (the store's default on Unix), "pread" with
// Options.PreadTables.
func BenchmarkGetFromTables(b *testing.B) {
	const keys = 500_000
	dir := b.TempDir()
	opts := embedded.Options{CacheSize: 1 << 20}
	s, err := embedded.Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	st, err := s.Claim(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for k := 0; k < keys; {
		var d persistence.CheckpointData
		for ; k < keys && len(d.Snapshots) < 10_000; k++ {
			data := make([]byte, 120)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			d.Snapshots = append(d.Snapshots, persistence.Snapshot{Key: fmt.Sprintf("logins\x00user-%07d", k), Data: data})
		}
		if err := s.Checkpoint(ctx, 1, st.Epoch, d); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil { // (the reopening flushes what the WAL holds)
		b.Fatal(err)
	}
	for _, pread := range []bool{false, true} {
		b.Run(map[bool]string{false: "mapped", true: "pread"}[pread], func(b *testing.B) {
			opts.PreadTables = pread
			s, err := embedded.Open(dir, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			for i := 0; b.Loop(); i++ {
				if _, err := s.Get(ctx, 1, fmt.Sprintf("logins\x00user-%07d", r.IntN(keys))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
