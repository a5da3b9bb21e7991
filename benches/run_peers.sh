#!/usr/bin/env bash
# Every comparison of BENCHMARKS.md in one command, release builds only,
# each cell run three times with the systems interleaved; writes one JSON
# object per run to benches/results/<part>.jsonl (stamped with the commit
# and date) and regenerates the part's tables in BENCHMARKS.md from it
# (benches/report.py). The peers are pip-installed into a venv under the
# work directory. The parts:
#
# - kv: the seed's KV protocol, integer and UUID keys x window 1 and 32 x a
#   local directory and the `s3-standard` store model: memwal
#   (examples/kv_bench.rs), SlateDB 0.18 (benches/peers/slatedb/) and Lance
#   MemWAL (pylance 14.0.2, benches/peers/lance_kv.py). memwal and SlateDB
#   take the model as an object_store wrapper (memwal::testing::LatencyStore
#   and the peer's copy of it); Lance talks S3 to moto through
#   benches/peers/s3_latency_proxy.py, which gives each request the same
#   delays. About 30 minutes.
# - hnsw: the graph (examples/hnsw_bench.rs) against faiss HNSWFlat, hnswlib
#   and usearch (benches/peers/hnsw_peers.py) on the same 20,000 x 1024-d
#   vectors, clustered and low-rank, one thread. About 10 minutes.
# - catalog: `__manifest` commits (examples/manifest_bench.rs) against
#   Lance's DirectoryNamespace (benches/peers/lance_manifest.py) at 1,000 and
#   10,000 entries, 1 and 8 processes. About 10 minutes.
# - shard-writer: Lance's shard-writer workload on memwal
#   (examples/shard_writer_bench.rs), FineWeb-shaped and vector-only rows,
#   HNSW on, durable, local and `s3-standard`. About 15 minutes.
# - multimodal: issue 15's LAION-like rows (a 20-100 KB image in a blob
#   column, a 768-d embedding, a caption) in 10-row puts at window 32 and 1,
#   local and `s3-standard`: memwal (examples/multimodal_bench.rs) with the
#   embedding HNSW-indexed and stored as plain bytes, and SlateDB 0.18 on the
#   same rows. About 8 minutes.
# - python: issue 16's Python package (python/benches/kv_bench.py, pip-installed
#   from ./python) on the KV protocol beside the Rust API (kv_bench) and
#   Lance MemWAL's ShardWriter, integer keys, local, window 32 and 1. About
#   5 minutes.
#
#   bash benches/run_peers.sh                        (every part)
#   bash benches/run_peers.sh --quick                (one small run of each: minutes, printed only)
#   bash benches/run_peers.sh --only hnsw            (one part)
#   bash benches/run_peers.sh --only kv --store s3-standard
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 parts="kv hnsw catalog shard-writer multimodal python" stores="local s3-standard"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --only) parts="$2"; shift ;;
    --store) stores="$2"; shift ;;
    *) echo "usage: $0 [--quick] [--only kv|hnsw|catalog|shard-writer|multimodal|python] [--store local|s3-standard]" >&2
       exit 2 ;;
  esac
  shift
done
runs=3
[ $quick = 1 ] && runs=1
work="${MEMWAL_BENCH_DIR:-/tmp/memwal-peers}"
target="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$work" benches/results
has() { [[ " $parts " == *" $1 "* ]]; }

# --- builds and the peers' environments -------------------------------------
examples=()
{ has kv || has python; } && examples+=(--example kv_bench)
has hnsw && examples+=(--example hnsw_bench)
has catalog && examples+=(--example manifest_bench)
has shard-writer && examples+=(--example shard_writer_bench)
has multimodal && examples+=(--example multimodal_bench)
cargo build --quiet --release "${examples[@]}"
bin="$target/release/examples"
if has kv || has multimodal; then
  cargo build --quiet --release --manifest-path benches/peers/slatedb/Cargo.toml \
    --target-dir "$target/peers"
fi
venv="$work/venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet pylance==14.0.2 numpy pyarrow 'moto[server]>=5.1,<6' boto3 \
  hnswlib faiss-cpu usearch

commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo "-dirty")
date=$(date -u +%FT%TZ)
# stamp FILE RUN [KEY=VALUE...]: each JSON object line on stdin, with the
# run, the commit, the date and the given fields added, appended to FILE.
stamp() {
  python3 -c 'import json,sys
def value(v):
    try:
        return json.loads(v)
    except ValueError:
        return v
with open(sys.argv[1], "a") as out:
    for line in sys.stdin.read().splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            d.update(run=int(sys.argv[2]), commit=sys.argv[3], date=sys.argv[4])
            d.update((k, value(v)) for k, v in (a.split("=", 1) for a in sys.argv[5:]))
            print(json.dumps(d), file=out)' "$1" "$2" "$commit" "$date" "${@:3}"
}
settle() { sync; sleep 1; }
# results PART: the part's results file, emptied.
results() {
  local f=benches/results/$1
  [ "$1" = kv ] && [ "$stores" != "local s3-standard" ] && f+=-${stores// /-}
  [ $quick = 1 ] && f+=-quick
  : > "$f.jsonl"
  echo "$f.jsonl"
}
publish() {
  if [ $quick = 1 ] || [ "$stores" != "local s3-standard" ]; then
    python3 benches/report.py "$1"
  else
    python3 benches/report.py "$1" --update BENCHMARKS.md
  fi
}

moto_pid= proxy_pid=
trap 'kill $moto_pid $proxy_pid 2>/dev/null || true' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- kv -----------------------------------------------------------------------
if has kv; then
  out=$(results kv)
  moto_port=$(free_port)
  proxy_port=$(free_port)
  "$venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 &
  moto_pid=$!
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$moto_port/" >/dev/null 2>&1 && break
    sleep 0.2
  done
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
          echo "kv run $run/$runs: $store keys=$keys window=$window rows=$rows" >&2
          common=(--keys "$keys" --window "$window" --rows "$rows" --reads "$reads")
          lance=(--keys "$keys" --window "$window" --rows "$rows" --reads "$lance_reads")
          settle
          "$bin/kv_bench" "${common[@]}" --store "$store" --dir "$work" --scans 1 | stamp "$out" "$run"
          settle
          "$target/peers/release/memwal-slatedb-peer" "${common[@]}" --store "$store" --dir "$work" \
            | stamp "$out" "$run"
          settle
          if [ "$store" = local ]; then
            "$venv/bin/python" benches/peers/lance_kv.py "${lance[@]}" --dir "$work" | stamp "$out" "$run"
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
              --s3 "http://127.0.0.1:$proxy_port" --store "$store" | stamp "$out" "$run"
            kill $proxy_pid && wait $proxy_pid 2>/dev/null || true
            proxy_pid=
          fi
        done
      done
    done
  done
  kill $moto_pid 2>/dev/null || true
  moto_pid=
  publish "$out"
fi

# --- hnsw ---------------------------------------------------------------------
if has hnsw; then
  out=$(results hnsw)
  size=(--n 20000 --queries 1000) cpu=1
  [ $quick = 1 ] && size=(--n 5000 --queries 200) cpu=0.2
  export OMP_NUM_THREADS=1
  for run in $(seq 1 "$runs"); do
    for shape in clustered low-rank; do
      echo "hnsw run $run/$runs: $shape" >&2
      settle
      "$bin/hnsw_bench" --shape "$shape" "${size[@]}" --min-cpu-seconds "$cpu" --write "$work/hnsw-$shape" \
        | stamp "$out" "$run" data="$shape"
      settle
      "$venv/bin/python" benches/peers/hnsw_peers.py --dir "$work/hnsw-$shape" \
        --min-cpu-seconds "$cpu" | stamp "$out" "$run" data="$shape"
    done
  done
  publish "$out"
fi

# --- catalog ------------------------------------------------------------------
if has catalog; then
  out=$(results catalog)
  secs=10
  [ $quick = 1 ] && secs=3
  entries=(1000 10000)
  [ $quick = 1 ] && entries=(1000)
  for n in "${entries[@]}"; do
    rm -rf "$work/catalog-m$n" "$work/catalog-l$n"
    echo "catalog: seeding $n entries" >&2
    "$bin/manifest_bench" seed-large --root "$work/catalog-m$n" --entries "$n" >/dev/null 2>&1
    "$venv/bin/python" benches/peers/lance_manifest.py seed-large --root "$work/catalog-l$n" \
      --entries "$n" >/dev/null 2>&1
  done
  for run in $(seq 1 "$runs"); do
    for n in "${entries[@]}"; do
      for c in 1 8; do
        echo "catalog run $run/$runs: entries=$n processes=$c" >&2
        settle
        "$bin/manifest_bench" run --root "$work/catalog-m$n" --workers "$c" \
          $([ "$c" -gt 1 ] && echo --processes) --duration-secs "$secs" \
          | stamp "$out" "$run" system=memwal entries="$n"
        settle
        "$venv/bin/python" benches/peers/lance_manifest.py run --root "$work/catalog-l$n" \
          --workers "$c" --duration-secs "$secs" 2>/dev/null \
          | stamp "$out" "$run" system=lance entries="$n"
      done
    done
  done
  publish "$out"
fi

# --- shard-writer ---------------------------------------------------------------
if has shard-writer; then
  out=$(results shard-writer)
  secs=20 sustained=120 unpaced=60000
  [ $quick = 1 ] && secs=4 sustained=12 unpaced=8000
  for run in $(seq 1 "$runs"); do
    for store in $stores; do
      # shape batch rate seconds: FineWeb rows at the issue's 4,000 rows/s
      # in puts of 10, 100 and 1,000 rows; vector-only rows; FineWeb
      # unpaced (32 puts in flight), the CPU-bound limit; and FineWeb long
      # enough for compactions to run beside the writes.
      for cell in "fineweb 100 4000 $secs" "fineweb 10 4000 $secs" "fineweb 1000 4000 $secs" \
                  "vector 100 4000 $secs" "fineweb 100 0 $secs" "fineweb 100 4000 $sustained"; do
        set -- $cell
        echo "shard-writer run $run/$runs: $store $cell" >&2
        settle
        "$bin/shard_writer_bench" --store "$store" --dir "$work" --shape "$1" --batch "$2" \
          --rate "$3" --seconds "$4" --rows "$unpaced" | stamp "$out" "$run"
      done
    done
  done
  publish "$out"
fi

# --- multimodal -------------------------------------------------------------------
if has multimodal; then
  out=$(results multimodal)
  for run in $(seq 1 "$runs"); do
    for store in $stores; do
      for window in 32 1; do
        # SlateDB at window 1 waits for its 100 ms flush per put: fewer rows.
        case "$store/$window" in
          local/32) rows=20000 ;;
          local/1) rows=1000 ;;
          */32) rows=2000 ;;
          *) rows=400 ;;
        esac
        [ $quick = 1 ] && rows=$((rows / 5))
        echo "multimodal run $run/$runs: $store window=$window rows=$rows" >&2
        common=(--rows "$rows" --put-rows 10 --window "$window" --reads 50 --store "$store" --dir "$work")
        for embedding in hnsw bytes; do
          settle
          "$bin/multimodal_bench" "${common[@]}" --embedding "$embedding" | stamp "$out" "$run"
        done
        settle
        "$target/peers/release/memwal-slatedb-peer" --workload multimodal "${common[@]}" \
          | stamp "$out" "$run"
      done
    done
  done
  publish "$out"
fi

# --- python -----------------------------------------------------------------------
if has python; then
  out=$(results python)
  # The package as the README installs it (a release build in this target
  # directory), beside pylance in the peers' venv.
  "$venv/bin/pip" install --quiet 'datafusion==55.0.0'
  "$venv/bin/pip" install --quiet --force-reinstall --no-deps ./python
  for run in $(seq 1 "$runs"); do
    for window in 32 1; do
      rows=1000000
      [ "$window" = 1 ] && rows=100000
      [ $quick = 1 ] && rows=$((rows / 10))
      echo "python run $run/$runs: window=$window rows=$rows" >&2
      common=(--window "$window" --rows "$rows")
      settle
      "$venv/bin/python" python/benches/kv_bench.py "${common[@]}" --reads 1000 --dir "$work" \
        | stamp "$out" "$run"
      settle
      "$bin/kv_bench" "${common[@]}" --keys int --reads 1000 --scans 1 --dir "$work" \
        | stamp "$out" "$run"
      settle
      "$venv/bin/python" benches/peers/lance_kv.py "${common[@]}" --keys int --reads 100 \
        --dir "$work" | stamp "$out" "$run"
    done
  done
  publish "$out"
fi
