#!/usr/bin/env bash
# Before/after, alternated: runs scripts/bench-scale.sh once per node binary
# per round, in turn, so that two builds (or one build under two
# environments, through a wrapper script that execs it) meet the same load
# generator and the same hours of a noisy machine; then prints each one's
# runs and medians (events/s, node CPU µs per event, ack p99, RSS).
#
# Usage: scripts/bench-ab.sh KEYS ROUNDS NODE_BIN...
#   DURATION=30s (each run), CONFIG=file, RATE=events/s (half load),
#   WARMUP=duration, WARMUP_EVENTS=n (bench-scale.sh's),
#   PROF=DIR: each run writes the node's CPU profile under
#   DIR/BIN-KEYS-rROUND/ (bench-scale.sh's PROFILES)
#   OUTDIR=dir for the JSON lines (default: a temp dir, printed)
# Runs are steady state, uniform keys, the embedded store. bench-scale.sh
# builds the load generator from this tree: leave its Go files alone while
# this runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 3 ] || { sed -n '2,16p' "$0"; exit 2; }
keys=$1 rounds=$2
shift 2
outdir=${OUTDIR:-$(mktemp -d)}
mkdir -p "$outdir"
for r in $(seq 1 "$rounds"); do
	for b in "$@"; do
		n=$(basename "$b")
		PROFILES=${PROF:+$PROF/$n-$keys-r$r} NODE_BIN=$b OUT=$outdir/$n-$keys.jsonl RUNS=1 \
			DURATION=${DURATION:-30s} DISTS=uniform PHASES=steady TARGETS=embedded \
			CONFIG=${CONFIG:-$root/examples/bench.yaml} RATE=${RATE:-} \
			"$root/scripts/bench-scale.sh" "$keys" >"$outdir/last.log" 2>&1 ||
			{ echo "run $r of $n failed: $outdir/last.log" >&2; exit 1; }
	done
done
for b in "$@"; do
	n=$(basename "$b")
	python3 - "$outdir/$n-$keys.jsonl" "$n" <<'PY'
import json, statistics as st, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
col = lambda k: [r.get(k, 0) for r in rs]
ev, cpu, p99, rss = col("events_per_s"), col("node_cpu_us_per_event"), col("p99_ms"), col("node_rss_bytes")
print(f"{sys.argv[2]}: events/s {[round(x/1e3,1) for x in ev]}k (median {st.median(ev)/1e3:.1f}k), "
      f"µs/event {[round(x,1) for x in cpu]} (median {st.median(cpu):.2f}), p99 ms {[round(x) for x in p99]}, "
      f"RSS MB {[int(x/2**20) for x in rss]} (mapped files {[int(x/2**20) for x in col('node_rss_file_bytes')]}), "
      f"store tables B/event flushed {[round(x) for x in col('node_store_flushed_bytes_per_event')]} "
      f"compacted {[round(x) for x in col('node_store_compacted_bytes_per_event')]}")
PY
done
echo "measurements: $outdir"
