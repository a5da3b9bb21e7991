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
MOTO_SERVER=${MOTO_SERVER:-$HOME/.cache/memwal-ci-venv/bin/moto_server}
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) lag_port=$(free_port)
"$MOTO_SERVER" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto=$!
# The latency: every chunk a client sends (a request) waits LAG_MS.
python3 - "$lag_port" "$port" "$LAG_MS" >"$work/proxy.log" 2>&1 <<'PY' &
import asyncio, sys
listen, target, lag = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000
async def pipe(r, w, delay):
    try:
        while data := await r.read(65536):
            if delay:
                await asyncio.sleep(delay)
            w.write(data)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def client(cr, cw):
    sr, sw = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(pipe(cr, sw, lag), pipe(sr, cw, 0))
async def main():
    async with await asyncio.start_server(client, "127.0.0.1", listen) as server:
        await server.serve_forever()
asyncio.run(main())
PY
proxy=$!
trap 'kill $moto $proxy 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -s "http://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.2; done
export AWS_ENDPOINT="http://127.0.0.1:$lag_port" AWS_ALLOW_HTTP=true AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=memwal AWS_SECRET_ACCESS_KEY=memwal
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
