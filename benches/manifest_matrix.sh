#!/usr/bin/env bash
# The catalog benchmark matrix behind BENCHMARKS.md: memwal's
# examples/manifest_bench.rs at 1K, 10K and 100K entries with C = 1, 8, 32
# (tasks of one process, and worker processes), the 30 s C = 32 process run,
# 10K sequential commits. One JSON object per line. The comparison with
# Lance's DirectoryNamespace is `bash benches/run_peers.sh --only catalog`.
#
#   bash benches/manifest_matrix.sh [WORKDIR]        (default /tmp/memwal-manifest-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/memwal-manifest-bench}"
secs="${SECS:-10}"
cargo build --quiet --release --example manifest_bench
bench="${CARGO_TARGET_DIR:-target}/release/examples/manifest_bench"
rm -rf "$work" && mkdir -p "$work"

label() { printf '%s ' "$1"; }
settle() { sync; sleep 2; }   # let writeback of the last phase finish

for n in 1000 10000 100000; do
  "$bench" seed-large --root "$work/m$n" --entries "$n" 2>/dev/null >/dev/null
done
for n in 1000 10000 100000; do
  for c in 1 8 32; do
    settle; label "memwal entries=$n tasks=$c"
    "$bench" run --root "$work/m$n" --workers "$c" --duration-secs "$secs"
  done
  for c in 8 32; do
    settle; label "memwal entries=$n processes=$c"
    "$bench" run --root "$work/m$n" --workers "$c" --processes --duration-secs "$secs"
  done
done
for n in 1000 10000; do
  settle; label "memwal entries=$n processes=32 30s"
  "$bench" run --root "$work/m$n" --workers 32 --processes --duration-secs 30
done
settle; label "memwal entries=10000 10000-sequential-commits"
"$bench" run --root "$work/m10000" --workers 1 --ops-per-worker 10000

