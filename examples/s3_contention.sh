#!/usr/bin/env bash
# Writers of one shard on an S3-compatible server with S3-like latency:
# W loops, each running a new `memwal` process per single-row INSERT into
# a one-shard table (so every statement claims the shard, and contended
# ones take it back), against moto behind a proxy that delays every
# request by LAG_MS. Prints one JSON line: statements, failures, seconds
# per statement (median, p90, max), rows found afterwards.
#
#   bash examples/s3_contention.sh            # W=3 N=40 LAG_MS=25
#   BIN=target/debug/memwal W=3 N=40 LAG_MS=50 bash examples/s3_contention.sh
#
# Needs python3 and moto (`pip install 'moto[server]'`; MOTO_SERVER names
# its executable, default: the one .ci/run installs).
set -euo pipefail
BIN=${BIN:-target/release/memwal}
W=${W:-3} N=${N:-40} LAG_MS=${LAG_MS:-25}
source "$(dirname "$0")/s3_lag.sh"
curl -sf -X PUT "http://127.0.0.1:$port/contention" >/dev/null
root=s3://contention/r
"$BIN" --root $root -q -c "CREATE TABLE t (id BIGINT PRIMARY KEY, n BIGINT) WITH ('shards' = '1')"
pids=""
for w in $(seq 1 "$W"); do
  (
    for i in $(seq 1 "$N"); do
      start=$(date +%s.%N)
      if "$BIN" --root $root -q -c "INSERT INTO t VALUES ($((w * 100000 + i)), $i)" >/dev/null 2>>"$work/errors"; then ok=1; else ok=0; fi
      echo "$ok $(echo "$(date +%s.%N) - $start" | bc)" >>"$work/times.$w"
    done
  ) &
  pids="$pids $!"
done
wait $pids
rows=$("$BIN" --root $root -q --format csv -c "SELECT count(*) AS n FROM t" | tail -1)
cat "$work"/times.* | python3 -c "
import json, statistics, sys
runs = [line.split() for line in sys.stdin]
secs = sorted(float(s) for _, s in runs)
print(json.dumps({'writers': $W, 'statements': len(runs), 'failed': sum(ok == '0' for ok, _ in runs),
  'lag_ms': $LAG_MS, 'median_s': round(statistics.median(secs), 3),
  'p90_s': round(secs[int(0.9 * (len(secs) - 1))], 3), 'max_s': round(secs[-1], 3), 'rows': int('$rows')}))"
