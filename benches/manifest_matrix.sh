#!/usr/bin/env bash
# The catalog benchmark matrix behind BENCHMARKS.md (issue 18): memwal's
# examples/manifest_bench.rs at 1K, 10K, 100K and 1M entries with C = 1 and
# 32 tasks of one process and 8 and 32 worker processes, on the local
# directory and behind the s3-standard latency model; 32 processes at 100K
# entries for 30 s; 100K commits (one version each) at 100K entries for the
# directory's size.
# One JSON object per line, after a label. The comparison with Lance's
# DirectoryNamespace is `bash benches/run_peers.sh --only catalog`.
#
#   bash benches/manifest_matrix.sh [WORKDIR]        (default /tmp/memwal-manifest-bench)
#
# SECS (default 10) sets each run's length; SIZES and STORES narrow the matrix.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/memwal-manifest-bench}"
secs="${SECS:-10}"
sizes="${SIZES:-1000 10000 100000 1000000}"
stores="${STORES:-local s3-standard}"
cargo build --quiet --release --example manifest_bench
bench="${CARGO_TARGET_DIR:-target}/release/examples/manifest_bench"
rm -rf "$work" && mkdir -p "$work"

label() { printf '%s ' "$1"; }
settle() { sync; sleep 2; }   # let writeback of the last phase finish

for n in $sizes; do
  "$bench" seed-large --root "$work/m$n" --entries "$n" 2>/dev/null >/dev/null
done
for store in $stores; do
  for n in $sizes; do
    for c in 1 32; do
      settle; label "memwal store=$store entries=$n tasks=$c"
      "$bench" run --root "$work/m$n" --store "$store" --workers "$c" --duration-secs "$secs"
    done
    for c in 8 32; do
      settle; label "memwal store=$store entries=$n processes=$c"
      "$bench" run --root "$work/m$n" --store "$store" --workers "$c" --processes --duration-secs "$secs"
    done
  done
done
settle; label "memwal store=local entries=100000 processes=32 30s"
"$bench" run --root "$work/m100000" --workers 32 --processes --duration-secs 30
settle; label "memwal store=local entries=100000 100000-commits"
"$bench" run --root "$work/m100000" --workers 1 --ops-per-worker 100000
