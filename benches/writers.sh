#!/usr/bin/env bash
# Many writer processes on one table, the figures behind BENCHMARKS.md
# ("Many writers, one table"): examples/soak.rs with no kills and no readers,
# W = 1, 2 and 8 writer processes, at the default 100 ms WAL cadence and in
# latency mode (--interval-ms 0), RUNS runs of SECS seconds each. Every
# statement must succeed and nothing acknowledged may be lost (soak exits
# non-zero otherwise). Prints each run's JSON, then one summary line per
# setting: statements/s as median [min-max].
#
#   bash benches/writers.sh            (RUNS=3 SECS=20 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${RUNS:-3}"
secs="${SECS:-20}"
cargo build --quiet --release --example soak
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
soak="$target/release/examples/soak"

summary=()
for interval in 100 0; do
  for writers in 1 2 8; do
    rates=()
    for run in $(seq 1 "$runs"); do
      sync; sleep 2
      line=$("$soak" --writers "$writers" --readers 0 --kill-every-ms 0 \
        --interval-ms "$interval" --seconds "$secs" 2>>/tmp/memwal-writers-bench.log)
      echo "$line"
      rates+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["statements_per_second"])' "$line")")
    done
    summary+=("$(python3 - "$writers" "$interval" "${rates[@]}" <<'EOF'
import statistics, sys
writers, interval, *rates = sys.argv[1:]
rates = sorted(float(r) for r in rates)
print(f"writers={writers} interval_ms={interval}: {statistics.median(rates):.1f} statements/s "
      f"[{rates[0]:.1f}-{rates[-1]:.1f}] over {len(rates)} runs")
EOF
)")
  done
done
printf '%s\n' "${summary[@]}"
