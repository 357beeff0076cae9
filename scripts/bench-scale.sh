#!/usr/bin/env bash
# State at scale, side by side in one run: for each key count and key
# distribution, the same load (`keyfold bench`, gRPC IngestStream: 4
# clients, 8 batches of 100 events in flight each) against
#   naive     the per-event Redis design users write by hand (one Lua script
#             call per event: SET NX of the id, HINCRBY/HINCRBYFLOAT/HSET),
#             pipelined per batch;
#   redis     keyfold serve --redis on the same Redis;
#   embedded  keyfold serve on its embedded store.
# The Redis has appendonly yes and appendfsync always, so every reply is as
# durable as a keyfold ack. Each target starts empty (FLUSHALL, a new data
# directory). Phase "first" measures from an empty store (mostly first-time
# keys at large counts); phase "steady" first sends one event to every key
# (--preload) and waits until the node has checkpointed them, then
# measures: every key is stored already, and beyond max_active_keys most
# are not in memory.
#
# Usage: scripts/bench-scale.sh [KEY COUNTS...]      (default: 10000 100000 1000000)
#   RUNS=3 DURATION=8s DISTS="uniform zipf" PHASES="first steady" CONFIG=examples/bench.yaml
#   NODE_BIN=path: run the nodes from another keyfold binary (an older build,
#   for a before/after comparison under the same load generator)
#   WARMUP=duration: load this long (not measured) before each measured
#   phase, after the preload (the store's compactions catch up meanwhile).
#   Keys remember the ids they applied (dedup_window): 30s leaves a million
#   keys a few ids each, 300s about 25, which costs keyfold more than half
#   its rate there (BENCHMARKS.md, session 39); measure both.
#   WARMUP_EVENTS=n: load n events (not measured) instead, or first with
#   WARMUP: two builds then meet the measured phase after the same load,
#   their keys remembering as many ids (after the same time a faster build
#   applied more events)
#   RATE=events/s: offer this rate instead of loading as fast as acks come
#   (keyfold bench --rate), to read the ack latency at a given load
#   TARGETS="naive redis embedded": the targets to run (a subset skips the
#   others' preloads, which take minutes each at 10M keys)
#   REDIS_ARGS="...": more redis-server options (for instance
#   "--auto-aof-rewrite-percentage 0" to see what AOF rewrites cost)
#   PROFILES=DIR: the nodes serve their profiles (serve --pprof) and each
#   node measurement writes the node's CPU profile of its measured phase to
#   DIR/TARGET-KEYS-DIST-PHASE-RUN.pprof
# Prints one JSON line per measurement to $OUT (default: a temp file), a
# table of medians with the ratios to naive, and one of the CPU each target
# cost per event (node + Redis + load generator, from `keyfold bench`).
# Everything it starts is stopped by PID when it exits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keys=("${@:-10000 100000 1000000}")
[ ${#keys[@]} -eq 1 ] && read -ra keys <<<"${keys[0]}"
runs=${RUNS:-3}
duration=${DURATION:-8s}
read -ra dists <<<"${DISTS:-uniform zipf}"
read -ra phases <<<"${PHASES:-first steady}"
read -ra targets <<<"${TARGETS:-naive redis embedded}"
want() { [[ " ${targets[*]} " == *" $1 "* ]]; }
config=${CONFIG:-$root/examples/bench.yaml}
load=(--stream --window 8 --concurrency 4 --batch 100 --duration "$duration" ${RATE:+--rate "$RATE"} ${WARMUP:+--warmup "$WARMUP"} ${WARMUP_EVENTS:+--warmup-events "$WARMUP_EVENTS"})

work=$(mktemp -d)
out=${OUT:-$work/results.jsonl}
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work/redis" "$work/data"
}
trap cleanup EXIT
free_port() { free_ports 1; }
# free_ports N: N distinct free loopback ports (asked one at a time, a port
# freed by the first ask can come back from the next).
free_ports() { python3 -c 'import socket, sys; ss = [socket.socket() for _ in range(int(sys.argv[1]))]; [s.bind(("127.0.0.1", 0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])' "$1"; }

go build -C "$root" -o "$work/keyfold" ./cmd/keyfold # (from anywhere: -C finds the module)
kf=$work/keyfold
nodebin=${NODE_BIN:-$kf}
rport=$(free_port)
mkdir -p "$work/redis"
read -ra redis_args <<<"${REDIS_ARGS:-}"
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
	--dir "$work/redis" --daemonize no "${redis_args[@]}" >"$work/redis.log" 2>&1 &
pids+=($!)
until redis-cli -p "$rport" ping >/dev/null 2>&1; do
	kill -0 "${pids[-1]}" 2>/dev/null || { echo "redis-server did not start (is it installed?):" >&2; cat "$work/redis.log" >&2; exit 1; }
	sleep 0.05
done
redis=redis://127.0.0.1:$rport

# node STORE_ARGS...: start a node, wait until it is ready; sets npid, grpc,
# http and prof (the bench arguments for its CPU profile, with PROFILES).
node() {
	local hport gport pport
	read -r hport gport pport < <(free_ports 3)
	prof=()
	[ -n "${PROFILES:-}" ] && prof=(--pprof "127.0.0.1:$pport")
	"$nodebin" serve --config "$config" --http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" "$@" "${prof[@]}" >>"$work/node.log" 2>&1 &
	npid=$!
	pids+=("$npid")
	http=http://127.0.0.1:$hport
	grpc=127.0.0.1:$gport
	until "$kf" health --addr "$grpc" >/dev/null 2>&1; do
		kill -0 "$npid" 2>/dev/null || { echo "the node exited at start:" >&2; tail -5 "$work/node.log" >&2; exit 1; }
		sleep 0.1
	done
}
stop_node() {
	kill "$npid"
	wait "$npid" 2>/dev/null || true
}
# record TARGET KEYS DIST PHASE RUN BENCH_ARGS...: run one measurement.
record() {
	local target=$1 k=$2 dist=$3 phase=$4 run=$5
	shift 5
	local args=()
	[ "$phase" = steady ] && args=(--preload)
	if [ "$target" != naive ] && [ -n "${PROFILES:-}" ]; then
		mkdir -p "$PROFILES"
		args+=("${prof[@]}" --cpu-profile "$PROFILES/$target-$k-$dist-$phase-$run.pprof")
	fi
	"$kf" bench "${load[@]}" --keys "$k" --dist "$dist" "${args[@]}" --json "$@" |
		python3 -c 'import json,sys; d=json.load(sys.stdin); d.update(target=sys.argv[1], phase=sys.argv[2], run=int(sys.argv[3])); print(json.dumps(d))' \
			"$target" "$phase" "$run" | tee -a "$out"
}

for k in "${keys[@]}"; do
	for dist in "${dists[@]}"; do
		for phase in "${phases[@]}"; do
			for run in $(seq 1 "$runs"); do
				if want naive; then
					redis-cli -p "$rport" flushall >/dev/null
					record naive "$k" "$dist" "$phase" "$run" --naive-redis "$redis" --redis-info "$redis"
				fi
				if want redis; then
					redis-cli -p "$rport" flushall >/dev/null
					node --redis "$redis"
					record redis "$k" "$dist" "$phase" "$run" --addr "$grpc" --metrics "$http" --redis-info "$redis"
					stop_node
				fi
				if want embedded; then
					rm -rf "$work/data"
					node --data "$work/data"
					record embedded "$k" "$dist" "$phase" "$run" --addr "$grpc" --metrics "$http"
					stop_node
				fi
			done
		done
	done
done

python3 - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["keys"], r["dist"], r["phase"]), {}).setdefault(r["target"], []).append(r)
med = lambda rs, f: statistics.median(r.get(f, 0) for r in rs)
print(f'{"keys":>9} {"dist":8} {"phase":7} {"naive ev/s":>11} {"redis ev/s":>11} {"x naive":>7} {"p99 ms":>7} {"embedded":>10} {"x naive":>7} {"p99 ms":>7} {"B/key heap":>10} {"B/key RSS":>9} {"cached":>9} {"runs":>4}')
for (k, dist, phase), t in sorted(groups.items()):
    n, rd, e = (med(t.get(x, [{}]), "events_per_s") for x in ("naive", "redis", "embedded"))
    print(f'{k:>9} {dist:8} {phase:7} {n:>11.0f} {rd:>11.0f} {rd/n if n else 0:>7.2f} {med(t.get("redis", [{}]), "p99_ms"):>7.0f} '
          f'{e:>10.0f} {e/n if n else 0:>7.2f} {med(t.get("embedded", [{}]), "p99_ms"):>7.0f} {med(t.get("embedded", [{}]), "node_heap_per_key"):>10.0f} '
          f'{med(t.get("embedded", [{}]), "node_rss_per_key"):>9.0f} {med(t.get("embedded", [{}]), "node_cached_keys"):>9.0f} {max(len(v) for v in t.values())}')
# CPU per event (µs, medians): what each target cost on the shared cores,
# node + Redis + load generator; the ratio is naive's sum over the target's.
cpu = lambda rs: statistics.median(r.get("node_cpu_us_per_event", 0) + r.get("redis_cpu_us_per_event", 0) + r.get("client_cpu_us_per_event", 0) for r in rs)
print(f'\nCPU µs per event, node + Redis + load generator (naive: Redis + load generator)')
print(f'{"keys":>9} {"dist":8} {"phase":7} {"naive":>7} {"redis":>7} {"naive/x":>7} {"embedded":>8} {"naive/x":>7}')
for (k, dist, phase), t in sorted(groups.items()):
    n, rd, e = (cpu(t[x]) if x in t else 0 for x in ("naive", "redis", "embedded"))
    print(f'{k:>9} {dist:8} {phase:7} {n:>7.1f} {rd:>7.1f} {n/rd if rd else 0:>7.2f} {e:>8.1f} {n/e if e else 0:>7.2f}')
EOF
echo "measurements: $out"
