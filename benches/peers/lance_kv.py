"""The peer side of examples/kv_bench.rs: the seed's KV write protocol on
Lance's MemWAL `ShardWriter` (PyPI `pylance==14.0.2`), one shard, so both
can be measured in one run on one machine.

    python3 -m venv /tmp/lance && /tmp/lance/bin/pip install pylance==14.0.2
    /tmp/lance/bin/python benches/peers/lance_kv.py --keys int --window 32
    /tmp/lance/bin/python benches/peers/lance_kv.py --window 1 --non-durable

A fresh dataset (`id` primary key, int64 `a`, int32 `b`, float64 `c`, a
72-character string `s`; int64 or random 16-byte binary keys) gets `--rows` rows in
`--put-rows`-row `ShardWriter.put`s from `--window` threads sharing one
writer, WAL interval `--interval-ms`, durable unless `--non-durable`. Every
batch is built before the clock starts; the clock stops when the last put
returns, and again after `close()`. Then `--reads` point lookups of random
written keys through `LsmPointLookupPlanner`. Prints one JSON object, with
kv_bench's field names where they apply.

Caveats: pylance's `ShardWriter.put` holds a per-writer lock across the whole
Rust put (the binding wraps the writer in a tokio Mutex), so the threads give
`--window` callers but one put in flight. A durable put returns once the WAL
flush holding its batch has completed, and on a local directory that flush is
a file write and rename with no fsync. `close()` flushes the MemTable to
SSTables, so the reads hit SSTables rather than a MemTable.
"""

import argparse
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmPointLookupPlanner, ShardSnapshot

p = argparse.ArgumentParser()
p.add_argument("--keys", choices=["int", "uuid"], default="int")
p.add_argument("--rows", type=int, default=1_000_000)
p.add_argument("--put-rows", type=int, default=1_000)
p.add_argument("--window", type=int, default=32)
p.add_argument("--interval-ms", type=int, default=100)
p.add_argument("--non-durable", action="store_true")
p.add_argument("--reads", type=int, default=1_000)
p.add_argument("--dir", default="/tmp/lance-kv-bench", help="a fresh subdirectory is made in it")
p.add_argument("--keep", action="store_true", help="keep the dataset directory")
args = p.parse_args()

os.makedirs(args.dir, exist_ok=True)
root = tempfile.mkdtemp(dir=args.dir)
# Lance's MemWAL refuses FixedSizeBinary(16) as a primary key ("unsupported
# type ... for hashing"), so UUIDs go in as variable Binary of 16 bytes.
key_type = pa.int64() if args.keys == "int" else pa.binary()
schema = pa.schema([
    pa.field("id", key_type, nullable=False,
             metadata={"lance-schema:unenforced-primary-key": "true"}),
    pa.field("a", pa.int64()),
    pa.field("b", pa.int32()),
    pa.field("c", pa.float64()),
    pa.field("s", pa.string()),
])
ds = lance.write_dataset(schema.empty_table(), root, schema=schema)
ds.initialize_mem_wal()
shard_id = str(uuid.uuid4())
writer = ds.mem_wal_writer(shard_id, durable_write=not args.non_durable,
                           max_wal_flush_interval_ms=args.interval_ms)

# Every batch is made before the clock starts.
ids = np.arange(args.rows, dtype=np.int64)
if args.keys == "int":
    keys = pa.array(ids)
else:  # random 16-byte keys, kept for the reads
    raw = np.random.default_rng(7).bytes(16 * args.rows)
    offsets = pa.py_buffer(np.arange(0, 16 * args.rows + 1, 16, dtype=np.int32))
    keys = pa.BinaryArray.from_buffers(key_type, args.rows, [None, offsets, pa.py_buffer(raw)])
text = pa.array(["x" * 72] * args.put_rows)
batches = [
    pa.record_batch([keys[lo:lo + n], pa.array(ids[lo:lo + n] * 7),
                     pa.array(ids[lo:lo + n].astype(np.int32)),
                     pa.array(ids[lo:lo + n] * 0.5), text[:n]], schema=schema)
    for lo in range(0, args.rows, args.put_rows)
    for n in [min(args.put_rows, args.rows - lo)]
]

next_batch = itertools.count()  # next() on it is atomic under the GIL


def worker():
    for i in next_batch:
        if i >= len(batches):
            return
        writer.put(batches[i])


threads = [threading.Thread(target=worker) for _ in range(args.window)]
started = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
write_seconds = time.perf_counter() - started
stats = writer.stats()
writer.close()
close_seconds = time.perf_counter() - started

files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
shard_dir = os.path.join(root, "_mem_wal", shard_id)
wal_objects = len(os.listdir(os.path.join(shard_dir, "wal")))

# Point reads: one planner over every SSTable generation `close()` left (the
# shard manifest names them by directory, relative to the shard).
gens = {int(m.group(1)): n for n in os.listdir(shard_dir) if (m := re.fullmatch(r".*_gen_(\d+)", n))}
snap = ShardSnapshot(shard_id).with_current_generation(max(gens, default=0) + 1)
for g, name in sorted(gens.items()):
    snap.with_sstable(g, name)
planner = LsmPointLookupPlanner(lance.dataset(root), [snap])
rng = np.random.default_rng(42)
lat = []
for i in rng.integers(0, args.rows, args.reads):
    t = time.perf_counter()
    got = planner.plan_lookup(keys[int(i):int(i) + 1]).to_table()
    lat.append(time.perf_counter() - t)
    assert got.num_rows == 1 and got["b"][0].as_py() == int(i), f"row {i} missing"
lat.sort()


def pct(q):
    return lat[round((len(lat) - 1) * q)] * 1e3 if lat else None


print(json.dumps({
    "peer": f"lance-memwal pylance {lance.__version__}",
    "keys": args.keys,
    "key_type": str(key_type),
    "rows": args.rows,
    "put_rows": args.put_rows,
    "window": args.window,
    "puts_in_flight": 1,  # the binding's per-writer lock
    "wal_interval_ms": args.interval_ms,
    "durable": not args.non_durable,
    "write_seconds": write_seconds,
    "rows_per_s": args.rows / write_seconds,
    "rows_per_s_including_close": args.rows / close_seconds,
    "wal_appends": stats["wal_flush_count"],
    "wal_bytes": stats["wal_flush_bytes"],
    "wal_objects": wal_objects,
    "sstables": len(gens),
    "disk_files": len(files),
    "disk_bytes": sum(os.path.getsize(f) for f in files),
    "reads": len(lat),
    "get_p50_ms": pct(0.5),
    "get_p99_ms": pct(0.99),
}))
if not args.keep:
    shutil.rmtree(root)
