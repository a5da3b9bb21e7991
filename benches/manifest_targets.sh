#!/usr/bin/env bash
# Issue 18's target cells of examples/manifest_bench.rs, RUNS times each
# (default 3), runs interleaved, then the median (min–max) of each cell:
# one process at 1K and 1M entries on the local directory, one process (C = 1
# and C = 32 tasks) at 1M entries behind the s3-standard latency model, 32
# processes at 100K entries for 30 s, and 100K commits (one version each)
# at 100K entries for the directory's size over one checkpoint.
#
#   bash benches/manifest_targets.sh [WORKDIR]       (default /tmp/memwal-manifest-targets)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/memwal-manifest-targets}"
runs="${RUNS:-3}"
cargo build --quiet --release --example manifest_bench
bench="${CARGO_TARGET_DIR:-target}/release/examples/manifest_bench"
rm -rf "$work" && mkdir -p "$work"
for n in 1000 100000 1000000; do
  "$bench" seed-large --root "$work/m$n" --entries "$n" >/dev/null 2>&1
done
cells=(
  "local 1000 --workers 1 --duration-secs 10"
  "local 1000000 --workers 1 --duration-secs 10"
  "s3-standard 1000000 --workers 1 --duration-secs 10"
  "s3-standard 1000000 --workers 32 --duration-secs 10"
  "local 100000 --workers 32 --processes --duration-secs 30"
  "local 100000 --workers 1 --ops-per-worker 100000"
)
out="$work/runs.txt"
for run in $(seq 1 "$runs"); do
  for cell in "${cells[@]}"; do
    set -- $cell
    store=$1 n=$2; shift 2
    sync; sleep 2
    printf '%s|' "$store entries=$n $*" >>"$out"
    "$bench" run --root "$work/m$n" --store "$store" "$@" >>"$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
cells = {}
for line in open(sys.argv[1]):
    label, js = line.split("|", 1)
    cells.setdefault(label, []).append(json.loads(js))
def show(values, fmt):
    m = statistics.median(values)
    return f"{fmt.format(m)} ({fmt.format(min(values))}–{fmt.format(max(values))})"
print("| cell | runs | commits/s | p50 ms | p99 ms | retry-budget errors | lost | directory / checkpoint |")
print("|---|---|---|---|---|---|---|---|")
for label, rs in cells.items():
    g = lambda k: [r[k] for r in rs]
    print(f"| {label} | {len(rs)} | {show(g('ops_per_s'), '{:,.1f}')} | {show(g('p50_ms'), '{:.3f}')} "
          f"| {show(g('p99_ms'), '{:.2f}')} | {show(g('retry_budget_error_pct'), '{:.2f}')} % "
          f"| {sum(g('lost'))} | {show(g('dir_over_checkpoint'), '{:.2f}')}× |")
PY
