package redisstore

// UsePerGroupScripts makes s append as it does on a Redis Cluster (one
// script call per group, pipelined), for benchmarks on a single Redis.
func UsePerGroupScripts(s *Store) { s.cluster = true }
