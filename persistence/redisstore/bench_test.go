package redisstore_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keyfold/keyfold/persistence"
	"github.com/keyfold/keyfold/persistence/redisstore"
	"github.com/keyfold/keyfold/persistence/redisstore/redistest"
)

// redisCPU returns the CPU seconds the server has used (user + system).
func redisCPU(b *testing.B, rc *redis.Client) float64 {
	info, err := rc.Info(b.Context(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return total
}

// BenchmarkAppend measures one group commit as the host makes it: records
// of 10 events' size (1 KiB) for 64 of 256 groups, appended in one call,
// with appendfsync always. It reports records/s and the Redis CPU per
// record, for one script call per commit (single Redis) and one per group
// (as on a cluster).
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []string{"one-call", "per-group"} {
		b.Run(mode, func(b *testing.B) {
			srv := redistest.Start(b)
			rc := srv.Client()
			s, err := redisstore.New(rc, redisstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			if mode == "per-group" {
				redisstore.UsePerGroupScripts(s)
			}
			const groups, perCommit = 256, 64
			epochs := make([]persistence.Epoch, groups)
			for g := range uint32(groups) {
				st, err := s.Claim(b.Context(), g)
				if err != nil {
					b.Fatal(err)
				}
				epochs[g] = st.Epoch
			}
			data := []byte(strings.Repeat("x", 1024))
			cpu0 := redisCPU(b, rc)
			b.ResetTimer()
			for i := range b.N {
				entries := make([]persistence.Entry, perCommit)
				for k := range entries {
					g := uint32((i*perCommit + k) % groups)
					entries[k] = persistence.Entry{Group: g, Epoch: epochs[g], Data: data}
				}
				if _, err := s.Append(b.Context(), entries); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			records := float64(b.N * perCommit)
			b.ReportMetric(records/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric((redisCPU(b, rc)-cpu0)*1e6/records, "redis-µs/record")
		})
	}
}

// BenchmarkCheckpoint measures a group's checkpoint as the host makes it
// at a million keys: 2,500 snapshots of 180 B, of keys spread over a
// million, with appendfsync always. It reports the Redis CPU per snapshot
// written.
func BenchmarkCheckpoint(b *testing.B) {
	srv := redistest.Start(b)
	rc := srv.Client()
	s, err := redisstore.New(rc, redisstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	st, err := s.Claim(b.Context(), 0)
	if err != nil {
		b.Fatal(err)
	}
	data := []byte(strings.Repeat("x", 180))
	const perCheckpoint = 2500
	cpu0 := redisCPU(b, rc)
	b.ResetTimer()
	for i := range b.N {
		snaps := make([]persistence.Snapshot, perCheckpoint)
		for k := range snaps {
			snaps[k] = persistence.Snapshot{Key: "logins\x00u" + strconv.Itoa((i*perCheckpoint+k*7919)%1_000_000), Data: data}
		}
		if err := s.Checkpoint(b.Context(), 0, st.Epoch, persistence.CheckpointData{Snapshots: snaps}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	n := float64(b.N * perCheckpoint)
	b.ReportMetric(n/b.Elapsed().Seconds(), "snapshots/s")
	b.ReportMetric((redisCPU(b, rc)-cpu0)*1e6/n, "redis-µs/snapshot")
}
