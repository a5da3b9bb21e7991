#!/usr/bin/env bash
# The KV benchmark matrix behind BENCHMARKS.md: the seed's KV protocol
# (examples/kv_bench.rs) on a local directory, one shard, 1,000,000 rows in
# 1,000-row puts: integer and UUID keys at window 32, window 1, at the
# 100 ms WAL interval; latency mode (interval 0) at window 1; non-durable
# puts; 8 MiB MemTables with compaction above 32 SSTables (reads over
# 10+ SSTables), and above 4 (compactions run while the writes do). Every run flushes and compacts while it writes, then reads
# after a reopen. One JSON object per line, each prefixed by its label.
#
#   bash benches/kv_matrix.sh [WORKDIR]        (default /tmp/memwal-kv-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/memwal-kv-bench}"
cargo build --quiet --release --example kv_bench
bench="${CARGO_TARGET_DIR:-target}/release/examples/kv_bench"
rm -rf "$work" && mkdir -p "$work"

run() {
  local label="$1"; shift
  sync; sleep 2   # let writeback of the last run finish
  printf '%s ' "$label"
  "$bench" --dir "$work" "$@"
}

run "int window=32 100ms durable"     --keys int  --window 32
run "uuid window=32 100ms durable"    --keys uuid --window 32
run "int window=1 100ms durable"      --keys int  --window 1
run "int window=1 latency-mode"       --keys int  --window 1 --interval-ms 0
run "int window=32 latency-mode"      --keys int  --window 32 --interval-ms 0
run "int window=1 non-durable"        --keys int  --window 1 --non-durable
run "int window=32 non-durable"       --keys int  --window 32 --non-durable
run "int window=32 8MiB memtables"    --keys int  --window 32 --memtable-mb 8 --max-sstables 32
run "uuid window=32 8MiB memtables"   --keys uuid --window 32 --memtable-mb 8 --max-sstables 32
run "int window=32 compacting"        --keys int  --window 32 --memtable-mb 8 --max-sstables 4
run "uuid window=32 compacting"       --keys uuid --window 32 --memtable-mb 8 --max-sstables 4
rm -rf "$work"
