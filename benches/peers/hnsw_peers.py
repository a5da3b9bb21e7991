"""The peer side of examples/hnsw_bench.rs: hnswlib, faiss HNSWFlat and
usearch on the vectors hnsw_bench wrote (`--write DIR`), with the same
parameters (M, ef_construction, k, the ef list), one thread. Each library
gets its best API: vectors added 1,000 per call, and all queries of an ef
searched in one call (on one thread), repeated until the passes took
--min-cpu-seconds of CPU. CPU time is the process clock
(`time.process_time`, nanoseconds). Prints one JSON object per library with
hnsw_bench's field names.

Run through `benches/run_peers.sh --only hnsw`, which builds the data and
installs the libraries into a venv.
"""

import argparse
import json
import os
import time

import numpy as np


def cpu():
    return time.process_time()


def recall(found, truth):
    hit = sum(len(set(f) & set(t)) for f, t in zip(found, truth))
    return hit / truth.size


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=100)
    p.add_argument("--ef", default="16,32,64,128")
    p.add_argument("--min-cpu-seconds", type=float, default=1.0)
    a = p.parse_args()
    data = np.fromfile(os.path.join(a.dir, "data.f32"), dtype="<f4").reshape(-1, a.dim)
    queries = np.fromfile(os.path.join(a.dir, "queries.f32"), dtype="<f4").reshape(-1, a.dim)
    truth = np.fromfile(os.path.join(a.dir, "truth.u32"), dtype="<u4").reshape(-1, a.k)
    efs = [int(e) for e in a.ef.split(",")]
    n = len(data)

    def report(engine, build_cpu, build_wall, search):
        rows = []
        for ef in efs:
            c, w = cpu(), time.perf_counter()
            found = search(queries, ef)
            passes = 1
            while cpu() - c < a.min_cpu_seconds:
                search(queries, ef)
                passes += 1
            c, w = cpu() - c, time.perf_counter() - w
            rows.append({
                "ef": ef,
                "recall": recall(found, truth),
                "passes": passes,
                "queries_per_cpu_s": len(queries) * passes / c,
                "queries_per_s": len(queries) * passes / w,
            })
        print(json.dumps({
            "engine": engine, "n": n, "dim": a.dim, "m": a.m,
            "ef_construction": a.ef_construction, "threads": 1,
            "build_cpu_s": build_cpu,
            "build_vectors_per_cpu_s": n / build_cpu,
            "build_vectors_per_s": n / build_wall,
            "search": rows,
        }), flush=True)

    import hnswlib
    index = hnswlib.Index(space="l2", dim=a.dim)
    index.init_index(max_elements=n, M=a.m, ef_construction=a.ef_construction, random_seed=42)
    index.set_num_threads(1)
    c, w = cpu(), time.perf_counter()
    for start in range(0, n, 1000):
        index.add_items(data[start:start + 1000], np.arange(start, min(n, start + 1000)))
    c, w = cpu() - c, time.perf_counter() - w

    def hnswlib_search(qs, ef):
        index.set_ef(max(ef, a.k))
        return index.knn_query(qs, k=a.k, num_threads=1)[0]
    report("hnswlib", c, w, hnswlib_search)

    import faiss
    faiss.omp_set_num_threads(1)
    fi = faiss.IndexHNSWFlat(a.dim, a.m)
    fi.hnsw.efConstruction = a.ef_construction
    c, w = cpu(), time.perf_counter()
    for start in range(0, n, 1000):
        fi.add(data[start:start + 1000])
    c, w = cpu() - c, time.perf_counter() - w

    def faiss_search(qs, ef):
        fi.hnsw.efSearch = max(ef, a.k)
        return fi.search(qs, a.k)[1]
    report("faiss HNSWFlat", c, w, faiss_search)

    from usearch.index import Index
    ui = Index(ndim=a.dim, metric="l2sq", dtype="f32", connectivity=a.m,
               expansion_add=a.ef_construction)
    c, w = cpu(), time.perf_counter()
    for start in range(0, n, 1000):
        ui.add(np.arange(start, min(n, start + 1000)), data[start:start + 1000], threads=1)
    c, w = cpu() - c, time.perf_counter() - w

    def usearch_search(qs, ef):
        ui.expansion_search = max(ef, a.k)
        return ui.search(qs, a.k, threads=1).keys
    report("usearch", c, w, usearch_search)


if __name__ == "__main__":
    main()
