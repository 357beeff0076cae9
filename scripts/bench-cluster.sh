#!/usr/bin/env bash
# Throughput of a keyfold cluster on this machine: a redis-server (AOF,
# appendfsync always) and N `keyfold serve --cluster` processes on loopback,
# loaded by `keyfold bench` spreading its clients over every node's HTTP API
# (as a load balancer would). Prints one line per run:
#   nodes=N run=R <keyfold bench's summary>
# Usage: scripts/bench-cluster.sh [RUNS] [DURATION] [NODE COUNTS...]
#   e.g. scripts/bench-cluster.sh 3 8s 1 2 3
# Everything it starts is stopped by PID when it exits.
set -euo pipefail
runs=${1:-3}
duration=${2:-8s}
shift 2 || true
counts=("${@:-1 2 3}")
[ ${#counts[@]} -eq 1 ] && read -ra counts <<<"${counts[0]}"

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
free_port() { free_ports 1; }
# free_ports N: N distinct free loopback ports (asked one at a time, a port
# freed by the first ask can come back from the next).
free_ports() { python3 -c 'import socket, sys; ss = [socket.socket() for _ in range(int(sys.argv[1]))]; [s.bind(("127.0.0.1", 0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])' "$1"; }

go build -C "$root" -o "$work/keyfold" ./cmd/keyfold # (from anywhere: -C finds the module)
for n in "${counts[@]}"; do
	for run in $(seq 1 "$runs"); do
		rport=$(free_port)
		mkdir -p "$work/redis-$n-$run"
		redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
			--dir "$work/redis-$n-$run" --daemonize no >"$work/redis.log" 2>&1 &
		rpid=$!
		pids+=("$rpid")
		until redis-cli -p "$rport" ping >/dev/null 2>&1; do
			kill -0 "$rpid" 2>/dev/null || { echo "redis-server did not start (is it installed?):" >&2; cat "$work/redis.log" >&2; exit 1; }
			sleep 0.05
		done
		addrs=()
		npids=()
		for i in $(seq 1 "$n"); do
			read -r hport gport < <(free_ports 2)
			"$work/keyfold" serve --config "$root/examples/quickstart.yaml" --redis "redis://127.0.0.1:$rport" \
				--cluster bench --http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" >"$work/node-$i.log" 2>&1 &
			npids+=($!)
			pids+=($!)
			addrs+=("http://127.0.0.1:$hport")
		done
		for a in "${addrs[@]}"; do
			until [ "$(curl -s -o /dev/null -w '%{http_code}' "$a/readyz")" = 200 ]; do sleep 0.1; done
		done
		# Every node must see the whole cluster before the load starts.
		until [ "$(curl -s "${addrs[0]}/v1/cluster" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(m["groups_serving"] for m in d["members"]) == d["key_groups"] and len(d["members"]))')" = "$n" ]; do sleep 0.1; done
		echo "nodes=$n run=$run $("$work/keyfold" bench --http "$(IFS=,; echo "${addrs[*]}")" --duration "$duration" --concurrency 8 --keys 10000)"
		for p in "${npids[@]}"; do kill "$p"; done
		for p in "${npids[@]}"; do wait "$p" 2>/dev/null || true; done
		kill "$rpid"
		wait "$rpid" 2>/dev/null || true
	done
done
