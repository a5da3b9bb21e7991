#!/usr/bin/env bash
# DROP TABLE of a table whose every shard was written, on an S3-compatible
# server with S3-like latency (moto behind a proxy that delays every
# request by LAG_MS): RUNS times, each on a fresh table of SHARDS shards
# filled with ROWS rows by one process, then dropped by another (whose
# time is measured, whole process). Prints one JSON line: the DROP's
# seconds (median, min, max).
#
#   bash examples/s3_drop.sh            # SHARDS=256 ROWS=5000 RUNS=3 LAG_MS=25
#   BIN=target/debug/memwal LAG_MS=50 bash examples/s3_drop.sh
#
# Needs python3 and moto (`pip install 'moto[server]'`; MOTO_SERVER names
# its executable, default: the one .ci/run installs).
set -euo pipefail
BIN=${BIN:-target/release/memwal}
SHARDS=${SHARDS:-256} ROWS=${ROWS:-5000} RUNS=${RUNS:-3} LAG_MS=${LAG_MS:-25}
source "$(dirname "$0")/s3_lag.sh"
curl -sf -X PUT "http://127.0.0.1:$port/drop" >/dev/null
for run in $(seq 1 "$RUNS"); do
  root=s3://drop/r$run
  "$BIN" --root $root -q \
    -c "CREATE TABLE t (id BIGINT PRIMARY KEY) WITH ('shards' = '$SHARDS')" \
    -c "INSERT INTO t SELECT value FROM generate_series(1, $ROWS)" >/dev/null
  start=$(date +%s.%N)
  "$BIN" --root $root -q -c "DROP TABLE t" >/dev/null
  echo "$(date +%s.%N) - $start" | bc >>"$work/times"
done
python3 -c "
import json, statistics
secs = sorted(float(s) for s in open('$work/times'))
print(json.dumps({'shards': $SHARDS, 'rows': $ROWS, 'lag_ms': $LAG_MS, 'runs': len(secs),
  'median_s': round(statistics.median(secs), 2), 'min_s': round(secs[0], 2), 'max_s': round(secs[-1], 2)}))"
