"""The peer side of examples/kv_bench.rs: the seed's KV write protocol on
Lance's MemWAL `ShardWriter` (PyPI `pylance==14.0.2`), one shard, so both
can be measured in one run on one machine.

    python3 -m venv /tmp/lance && /tmp/lance/bin/pip install pylance==14.0.2
    /tmp/lance/bin/python benches/peers/lance_kv.py --keys int --window 32
    /tmp/lance/bin/python benches/peers/lance_kv.py --window 1 --non-durable

With `--s3 URL` the dataset lives in a fresh prefix of bucket `memwal-bench`
on the S3-compatible server at URL (benches/run_peers.sh puts moto behind
benches/peers/s3_latency_proxy.py, which gives every request the latency of
memwal's `s3-standard` profile); the JSON then carries the proxy's request
counts.

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
p.add_argument("--s3", help="endpoint of an S3-compatible server (see above)")
p.add_argument("--store", default="local", help="the store's name, as the JSON reports it")
args = p.parse_args()

BUCKET = "memwal-bench"
if args.s3:
    import urllib.request

    import boto3

    s3 = boto3.client("s3", endpoint_url=args.s3, region_name="us-east-1",
                      aws_access_key_id="memwal", aws_secret_access_key="memwal")
    try:
        s3.create_bucket(Bucket=BUCKET)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    prefix = f"lance-{uuid.uuid4()}"
    root = f"s3://{BUCKET}/{prefix}"
    storage = {"endpoint": args.s3, "allow_http": "true", "region": "us-east-1",
               "access_key_id": "memwal", "secret_access_key": "memwal"}
    # The point-lookup planner opens the SSTables without storage options:
    # it finds the server through the environment.
    os.environ.update(AWS_ENDPOINT=args.s3, AWS_ALLOW_HTTP="true", AWS_REGION="us-east-1",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="memwal",
                      AWS_SECRET_ACCESS_KEY="memwal")

    def listing(sub=""):
        """(path relative to the dataset, size) of every object under it."""
        out, token = [], {}
        while True:
            page = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/{sub}", **token)
            out += [(o["Key"][len(prefix) + 1:], o["Size"]) for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return out
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def requests():
        with urllib.request.urlopen(f"{args.s3}/__counts") as r:
            return json.load(r)
else:
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(dir=args.dir)
    storage = None

    def listing(sub=""):
        base = os.path.join(root, sub)
        return [(os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
                for d, _, fs in os.walk(base) for f in fs]

    def requests():
        return None
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
ds = lance.write_dataset(schema.empty_table(), root, schema=schema, storage_options=storage)
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
written = requests()

files = listing()
shard = f"_mem_wal/{shard_id}/"
wal_objects = sum(1 for f, _ in files if f.startswith(shard + "wal/"))

# Point reads: one planner over every SSTable generation `close()` left (the
# shard manifest names them by directory, relative to the shard).
children = {f[len(shard):].split("/", 1)[0] for f, _ in files if f.startswith(shard)}
gens = {int(m.group(1)): n for n in children if (m := re.fullmatch(r".*_gen_(\d+)", n))}
snap = ShardSnapshot(shard_id).with_current_generation(max(gens, default=0) + 1)
for g, name in sorted(gens.items()):
    snap.with_sstable(g, name)
planner = LsmPointLookupPlanner(lance.dataset(root, storage_options=storage), [snap])
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
    "system": f"lance-memwal pylance {lance.__version__}",
    "store": args.store,
    "requests_until_close": written,
    "requests_in_all": requests(),
    "settings": "ShardWriter(durable_write, max_wal_flush_interval_ms = --interval-ms); all else default",
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
    "disk_bytes": sum(size for _, size in files),
    "disk_bytes_per_row": sum(size for _, size in files) / args.rows,
    "reads": len(lat),
    "get_p50_ms": pct(0.5),
    "get_p99_ms": pct(0.99),
}))
if not args.keep and not args.s3:
    shutil.rmtree(root)
