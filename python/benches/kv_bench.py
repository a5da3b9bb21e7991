"""The seed's KV write protocol through memwal's Python `Table.put`, the
Python side of examples/kv_bench.rs (same table, rows and settings), so
the two, and Lance's MemWAL `ShardWriter` (benches/peers/lance_kv.py), can
be compared in one run: `bash benches/run_peers.sh --only python`.

    pip install ./python
    python python/benches/kv_bench.py --window 32 --rows 1000000

A fresh root gets a one-shard table (`id BIGINT` key, int64 `a`, int32 `b`,
float64 `c`, a 72-character string `s`); `--rows` rows in `--put-rows`-row
puts (pyarrow Tables, all built before the clock starts) from `--window`
threads, each put returning once durable; WAL interval `--interval-ms`.
The clock stops when the last put returns, and again after `close()`.
(The first put, which opens the writer, is made before the clock starts
and not counted.) Then `--reads` point lookups of random written keys through `Table.get`
on a reopened root. Prints one JSON object with kv_bench's field names.
"""

import argparse
import itertools
import json
import os
import random
import tempfile
import threading
import time

import pyarrow as pa

import memwal

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=1_000_000)
p.add_argument("--put-rows", type=int, default=1_000)
p.add_argument("--window", type=int, default=32)
p.add_argument("--interval-ms", type=int, default=100)
p.add_argument("--non-durable", action="store_true")
p.add_argument("--reads", type=int, default=1_000)
p.add_argument("--dir", default="/tmp/memwal-python-bench", help="a fresh subdirectory is made in it")
args = p.parse_args()

os.makedirs(args.dir, exist_ok=True)
location = tempfile.mkdtemp(dir=args.dir)
options = {"wal_flush_interval": f"{args.interval_ms}ms", "durable": not args.non_durable}
root = memwal.open(location, **options)
root.sql("CREATE TABLE kv (id BIGINT PRIMARY KEY, a BIGINT, b INT, c DOUBLE, s VARCHAR)")
table = root.table("kv")

# Every batch is made before the clock starts, in the table's own types.
text = pa.array(["x" * 72] * args.put_rows, type=table.schema.field("s").type)
batches = []
for lo in range(0, args.rows, args.put_rows):
    n = min(args.put_rows, args.rows - lo)
    ids = pa.array(range(lo, lo + n), type=pa.int64())
    batches.append(pa.Table.from_arrays(
        [ids, pa.array(range(lo * 7, (lo + n) * 7, 7), type=pa.int64()),
         pa.array(range(lo, lo + n), type=pa.int32()),
         pa.array([i * 0.5 for i in range(lo, lo + n)], type=pa.float64()), text[:n]],
        schema=table.schema))
# The writer opens (claims the shard, fences) before the clock starts,
# with the first put; the clock times the others.
table.put(batches[0])
timed_rows = args.rows - batches[0].num_rows

next_batch = itertools.count(1)  # next() on it is atomic under the GIL


def worker():
    for i in next_batch:
        if i >= len(batches):
            return
        table.put(batches[i])


threads = [threading.Thread(target=worker) for _ in range(args.window)]
started = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
write_seconds = time.perf_counter() - started
stats = table.stats()[0]
root.close()
close_seconds = time.perf_counter() - started

root = memwal.open(location, **options)
table = root.table("kv")
rng = random.Random(42)
latencies = []
for _ in range(args.reads):
    key = rng.randrange(args.rows)
    t = time.perf_counter()
    got = table.get([key])
    latencies.append(time.perf_counter() - t)
    assert got.num_rows == 1 and got.column("b")[0].as_py() == key, f"row {key} missing"
root.close()
latencies.sort()


def pct(q):
    return latencies[round((len(latencies) - 1) * q)] * 1e3 if latencies else None


print(json.dumps({
    "system": "memwal-python",
    "debug_assertions": memwal._memwal.DEBUG_ASSERTIONS,
    "store": "local",
    "settings": f"wal_flush_interval={args.interval_ms}ms, durable={not args.non_durable}; "
                "all else default",
    "keys": "int",
    "rows": args.rows,
    "put_rows": args.put_rows,
    "window": args.window,
    "wal_interval_ms": args.interval_ms,
    "durable": not args.non_durable,
    "write_seconds": write_seconds,
    "rows_per_s": timed_rows / write_seconds,
    "rows_per_s_including_close": timed_rows / close_seconds,
    "wal_appends": stats["wal_appends"],
    "get_p50_ms": pct(0.5),
    "get_p99_ms": pct(0.99),
}))
