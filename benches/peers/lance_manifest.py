"""The peer side of examples/manifest_bench.rs: Lance's `__manifest`
catalog (`lance.namespace.DirectoryNamespace`, PyPI `pylance==14.0.2`) under
the same protocol, so both can be measured in one run on one machine.

    python benches/peers/lance_manifest.py seed-large --root DIR --entries N
    python benches/peers/lance_manifest.py run --root DIR --workers C --duration-secs S

`run` has C worker processes each create a namespace and drop it again,
alternately (one commit per op), and prints one JSON object like
manifest_bench's: ops/s, latency percentiles, errors, and the size of the
catalog directory.
"""

import argparse
import json
import multiprocessing as mp
import os
import time
import uuid

import lance.namespace as ns


def seed(root, entries):
    d = ns.DirectoryNamespace(root=root)
    have = len(d.list_namespaces(ns.ListNamespacesRequest(id=[])).namespaces or [])
    start = time.time()
    for i in range(have, entries):
        d.create_namespace(ns.CreateNamespaceRequest(id=[f"seed{i:08}"]))
        if i % 500 == 0:
            print(f"\rseeded {i}/{entries}", end="", flush=True, file=__import__("sys").stderr)
    print(json.dumps({"seeded": entries, "secs": round(time.time() - start, 2)}))


def worker(root, start, secs, out):
    d = ns.DirectoryNamespace(root=root)
    wid = uuid.uuid4().hex[:8]
    time.sleep(max(0.0, start - time.time()))  # start together
    deadline = start + secs
    lat, errors, i, to_drop = [], 0, 0, None
    while time.time() < deadline:
        i += 1
        t = time.perf_counter()
        try:
            if to_drop is None:
                name = f"w{wid}_{i}"
                d.create_namespace(ns.CreateNamespaceRequest(id=[name]))
                to_drop = name
            else:
                d.drop_namespace(ns.DropNamespaceRequest(id=[to_drop]))
                to_drop = None
            lat.append(time.perf_counter() - t)
        except Exception:  # a lost race the library did not retry
            errors += 1
    out.put((lat, errors))


def run(root, workers, secs):
    ctx = mp.get_context("spawn")  # lance is not fork-safe
    out = ctx.Queue()
    start = time.time() + 3.0 + 0.1 * workers
    procs = [ctx.Process(target=worker, args=(root, start, secs, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    lat = sorted(x for r in results for x in r[0])
    errors = sum(r[1] for r in results)

    def pct(p):
        return round(1000 * lat[min(len(lat) - 1, int(len(lat) * p))], 3) if lat else 0

    size = sum(
        os.path.getsize(os.path.join(dp, f))
        for dp, _, fs in os.walk(os.path.join(root, "__manifest"))
        for f in fs
    )
    print(json.dumps({
        "peer": "lance DirectoryNamespace", "workers": workers, "ops": len(lat),
        "secs": secs, "ops_per_s": round(len(lat) / secs, 1),
        "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
        "errors": errors, "manifest_dir_bytes": size,
    }))


if __name__ == "__main__":
    a = argparse.ArgumentParser()
    a.add_argument("cmd", choices=["seed-large", "run"])
    a.add_argument("--root", required=True)
    a.add_argument("--entries", type=int, default=1000)
    a.add_argument("--workers", type=int, default=1)
    a.add_argument("--duration-secs", type=float, default=10.0)
    args = a.parse_args()
    if args.cmd == "seed-large":
        seed(args.root, args.entries)
    else:
        run(args.root, args.workers, args.duration_secs)
