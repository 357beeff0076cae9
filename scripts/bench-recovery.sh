#!/usr/bin/env bash
# Recovery after a crash, measured: one embedded node under the load of
# scripts/bench-scale.sh (keyfold bench over gRPC IngestStream, uniform
# keys, every key preloaded), killed with SIGKILL once the log above its
# checkpoints (keyfold_log_bytes_unchecked) reaches FRACTION of the replay
# bound (checkpoint_max_bytes), then restarted on the same data directory; prints the
# log it had to replay and how long until the restarted node was ready
# (`keyfold health`), with the node's own "recovered" line (records
# replayed, keys activated, time).
#
# Usage: scripts/bench-recovery.sh [CONFIG] [FRACTION]
#   CONFIG defaults to examples/bench.yaml, FRACTION to 0.8;
#   KEYS=1000000 keys; NODE_BIN=path: the keyfold binary to run the node;
#   PROFILE=FILE: the restarted node's CPU profile of its first PSECS (10)
#   seconds (serve --pprof).
# If the log does not reach FRACTION within 150 s the node is killed then.
# Everything it starts is stopped by PID when it exits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
config=${1:-$root/examples/bench.yaml}
fraction=${2:-0.8}
keys=${KEYS:-1000000}
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
# free_ports N: N distinct free loopback ports (asked one at a time, a port
# freed by the first ask can come back from the next).
free_ports() { python3 -c 'import socket, sys; ss = [socket.socket() for _ in range(int(sys.argv[1]))]; [s.bind(("127.0.0.1", 0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])' "$1"; }
go build -C "$root" -o "$work/keyfold" ./cmd/keyfold # (from anywhere: -C finds the module)
kf=$work/keyfold
nodebin=${NODE_BIN:-$kf}
# The replay bound: checkpoint_max_bytes, by default 256 MiB, or 4 ×
# checkpoint_bytes where only that is set (actors.CheckpointBounds).
start_bytes=$(awk '/^checkpoint_bytes:/{print $2}' "$config")
limit=$(awk '/^checkpoint_max_bytes:/{print $2}' "$config")
limit=$(python3 -c "print(int((${limit:-0} or 4 * ${start_bytes:-0} or 268435456) * $fraction))")
read -r hport gport pport < <(free_ports 3) # (pport: the restarted node's profile)
metrics() { curl -s "http://127.0.0.1:$hport/metrics" | awk '/^keyfold_log_bytes_unchecked /{printf "%d", $2}'; }

"$nodebin" serve --config "$config" --data "$work/data" --http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$work/node1.log" 2>&1 &
node=$!
pids+=("$node")
until "$kf" health --addr "127.0.0.1:$gport" >/dev/null 2>&1; do sleep 0.1; done
"$kf" bench --stream --window 8 --concurrency 4 --batch 100 --keys "$keys" --dist uniform --preload \
	--duration 300s --addr "127.0.0.1:$gport" >"$work/bench.log" 2>&1 &
bench=$!
pids+=("$bench")
start=$SECONDS
unchecked=0
while ((SECONDS - start < 150)); do
	unchecked=$(metrics || true)
	if ((SECONDS - start > 20 && ${unchecked:-0} >= limit)); then break; fi
	sleep 0.2
done
kill -9 "$node"
wait "$node" 2>/dev/null || true
kill "$bench" 2>/dev/null || true
wait "$bench" 2>/dev/null || true

prof=()
if [ -n "${PROFILE:-}" ]; then
	prof=(--pprof "127.0.0.1:$pport")
fi
t0=$(date +%s.%N)
"$nodebin" serve --config "$config" --data "$work/data" --http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" "${prof[@]}" >"$work/node2.log" 2>&1 &
node=$!
pids+=("$node")
if [ -n "${PROFILE:-}" ]; then
	until curl -sf -o "$PROFILE" "http://127.0.0.1:$pport/debug/pprof/profile?seconds=${PSECS:-10}"; do sleep 0.02; done &
	pids+=($!)
fi
until "$kf" health --addr "127.0.0.1:$gport" >/dev/null 2>&1; do sleep 0.05; done
t1=$(date +%s.%N)
echo "keys $keys; log above the checkpoints at the kill: $((unchecked >> 20)) MiB; ready $(python3 -c "print(round($t1 - $t0, 2))") s after the restart; $(grep -o 'msg=recovered.*' "$work/node2.log")"
if [ -n "${PROFILE:-}" ]; then
	wait "${pids[-1]}" || true
fi
