#!/usr/bin/env bash
# The KV comparison of BENCHMARKS.md in one command: memwal (examples/kv_bench.rs),
# SlateDB 0.18 (benches/peers/slatedb/) and Lance MemWAL (pylance 14.0.2,
# benches/peers/lance_kv.py) on the same protocol, integer and UUID keys x
# window 1 and 32 x a local directory and the `s3-standard` store model,
# every cell run three times with the systems interleaved. memwal and
# SlateDB take the model as an object_store wrapper (memwal::testing::
# LatencyStore and the peer's copy of it); Lance talks S3 to moto through
# benches/peers/s3_latency_proxy.py, which gives each request the same
# delays. Release builds only. Writes benches/results/kv.jsonl (one JSON
# object per run, stamped with the commit and date) and regenerates the
# tables of BENCHMARKS.md from it (benches/report.py).
#
#   bash benches/run_peers.sh                      (about 30 minutes after the builds)
#   bash benches/run_peers.sh --quick              (one run of small cells: minutes)
#   bash benches/run_peers.sh --store s3-standard  (one store's cells only)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 stores="local s3-standard"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --store) stores="$2"; shift ;;
    *) echo "usage: $0 [--quick] [--store local|s3-standard]" >&2; exit 2 ;;
  esac
  shift
done
runs=3
[ $quick = 1 ] && runs=1
work="${MEMWAL_BENCH_DIR:-/tmp/memwal-peers}"
target="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$work" benches/results
results=benches/results/kv.jsonl
[ "$stores" != "local s3-standard" ] && results=benches/results/kv-${stores// /-}.jsonl
[ $quick = 1 ] && results=benches/results/kv-quick.jsonl
: > "$results"

# --- builds and the peers' environments -------------------------------------
cargo build --quiet --release --example kv_bench
cargo build --quiet --release --manifest-path benches/peers/slatedb/Cargo.toml \
  --target-dir "$target/peers"
memwal="$target/release/examples/kv_bench"
slatedb="$target/peers/release/memwal-slatedb-peer"
venv="$work/venv"
if [ ! -x "$venv/bin/moto_server" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet pylance==14.0.2 numpy pyarrow 'moto[server]>=5.1,<6' boto3
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
moto_port=$(free_port)
proxy_port=$(free_port)
"$venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 &
moto_pid=$!
proxy_pid=
trap 'kill $moto_pid $proxy_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -s "http://127.0.0.1:$moto_port/" >/dev/null 2>&1 && break
  sleep 0.2
done

commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo "-dirty")
date=$(date -u +%FT%TZ)
stamp() {  # adds the cell, run, commit and date to the one JSON line on stdin
  python3 -c 'import json,sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
d.update(run=int(sys.argv[1]), commit=sys.argv[2], date=sys.argv[3])
print(json.dumps(d))' "$1" "$commit" "$date" >>"$results"
}

# --- the matrix ---------------------------------------------------------------
for run in $(seq 1 "$runs"); do
  for store in $stores; do
    for keys in int uuid; do
      for window in 32 1; do
        # Window 1 is 1,000-row puts one at a time at the 100 ms cadence:
        # a tenth of the rows. The S3 cells: a fifth of that, and 500
        # reads (a read that misses costs a GET of about 25 ms). Lance's
        # reads take 5-20 ms locally and 400 ms on S3: 1,000 and 50.
        rows=1000000 reads=10000 lance_reads=1000
        [ "$window" = 1 ] && rows=100000
        [ "$store" != local ] && rows=$((rows / 5)) && reads=500 && lance_reads=50
        [ $quick = 1 ] && rows=$((rows / 10)) && reads=$((reads / 10)) && lance_reads=20
        echo "run $run/$runs: $store keys=$keys window=$window rows=$rows" >&2
        common=(--keys "$keys" --window "$window" --rows "$rows" --reads "$reads")
        lance=(--keys "$keys" --window "$window" --rows "$rows" --reads "$lance_reads")
        sync; sleep 1
        "$memwal" "${common[@]}" --store "$store" --dir "$work" --scans 1 | stamp "$run"
        sync; sleep 1
        "$slatedb" "${common[@]}" --store "$store" --dir "$work" | stamp "$run"
        sync; sleep 1
        if [ "$store" = local ]; then
          "$venv/bin/python" benches/peers/lance_kv.py "${lance[@]}" --dir "$work" | stamp "$run"
        else
          # A fresh proxy per run: its counts are this run's.
          "$venv/bin/python" benches/peers/s3_latency_proxy.py --profile "$store" \
            --upstream "http://127.0.0.1:$moto_port" --port "$proxy_port" &
          proxy_pid=$!
          for _ in $(seq 1 50); do
            curl -s "http://127.0.0.1:$proxy_port/__counts" >/dev/null 2>&1 && break
            sleep 0.1
          done
          "$venv/bin/python" benches/peers/lance_kv.py "${lance[@]}" \
            --s3 "http://127.0.0.1:$proxy_port" --store "$store" | stamp "$run"
          kill $proxy_pid && wait $proxy_pid 2>/dev/null || true
          proxy_pid=
        fi
      done
    done
  done
done

if [ $quick = 1 ] || [ "$stores" != "local s3-standard" ]; then
  python3 benches/report.py "$results"
else
  python3 benches/report.py "$results" --update BENCHMARKS.md
fi
