#!/usr/bin/env bash
# memwal's HNSW against hnswlib, faiss HNSWFlat and usearch in one run, on
# the same deterministic vectors (20,000 × 1024-d, clustered and low-rank),
# M = 16, ef_construction = 100, k = 10, one thread. The peers are installed
# with pip into a throw-away venv. One JSON object per engine and data set,
# each prefixed by the data set's name. Not part of CI.
#
#   bash benches/hnsw_peers.sh [WORKDIR]        (default /tmp/memwal-hnsw-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/memwal-hnsw-bench}"
mkdir -p "$work"
if [ ! -x "$work/venv/bin/python" ]; then
  python3 -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet numpy hnswlib faiss-cpu usearch
fi
# A release build, as the peers' wheels are (the first one compiles
# DataFusion in release: about 25 minutes on two cores).
cargo build --quiet --release --example hnsw_bench
bench="${CARGO_TARGET_DIR:-target}/release/examples/hnsw_bench"
export OMP_NUM_THREADS=1
for shape in clustered low-rank; do
  "$bench" --shape "$shape" --write "$work/$shape" | sed "s/^/$shape /"
  "$work/venv/bin/python" benches/peers/hnsw_peers.py --dir "$work/$shape" | sed "s/^/$shape /"
done
