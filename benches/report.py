"""The comparison tables of BENCHMARKS.md, from the JSON lines that
benches/run_peers.sh writes under benches/results/: per cell and system the
median of the runs with min-max, and memwal's ratio to each peer. Refuses
a line from a build with debug assertions.

    python3 benches/report.py benches/results/kv.jsonl [--update BENCHMARKS.md]

The table kind comes from the file's name: kv*, hnsw*, catalog*,
shard-writer*, multimodal* or python*. With --update, the text between `<!-- KIND:begin -->` and
`<!-- KIND:end -->` in that file is replaced; otherwise the tables are
printed.
"""

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict


def load(path):
    lines = []
    for n, line in enumerate(open(path), 1):
        d = json.loads(line)
        if d.get("debug_assertions"):
            sys.exit(f"{path}:{n}: {d.get('system', d.get('engine'))} was built with "
                     "debug assertions; rebuild with --release before publishing")
        lines.append(d)
    return lines


def stamp(lines):
    meta = next(({k: d[k] for k in ("commit", "date")} for d in reversed(lines)
                 if "commit" in d), {})
    return (f"Commit {meta.get('commit', '?')}, {meta.get('date', '?')}; median of the "
            "runs (min–max); each run goes through every cell, and a cell's systems run "
            "one after another.\n")


def summary(values, fmt):
    """`median (min–max)` of the values that are there, and the median."""
    values = [v for v in values if v is not None]
    if not values:
        return "—", None
    med = statistics.median(values)
    text = fmt(med)
    if len(values) > 1 and min(values) != max(values):
        text += f" ({fmt(min(values))}–{fmt(max(values))})"
    return text, med


def ratio(a, b):
    if not a or not b:
        return "—"
    r = a / b
    return f"{r:.2f}×" if r >= 0.1 else f"1/{1 / r:,.0f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def k(v):
    return f"{v / 1e3:,.1f} K"


def mb(v):
    return f"{v / 1e6:,.1f}"


def ms(v):
    return f"{v:.2g}" if v < 0.1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def count(v):
    return f"{v:,.0f}"


def pct(v):
    return f"{v * 100:.2f} %"


# --- KV: benches/run_peers.sh --only kv ---------------------------------------

KV_SYSTEMS = ["memwal", "slatedb", "lance-memwal"]


def kv_metric(d, name):
    if name == "p50":
        return d.get("rust_get_p50_ms", d.get("get_p50_ms"))
    if name == "p99":
        return d.get("rust_get_p99_ms", d.get("get_p99_ms"))
    if name == "puts":
        r = d.get("requests_until_close")
        return r["put"]["requests"] if r else d.get("disk_files")
    return d[name]


def kv(lines):
    cells = defaultdict(lambda: defaultdict(list))  # (store, keys, window) -> system -> [line]
    for d in lines:
        system = d["system"].split(" ")[0].split("-0")[0]  # memwal, slatedb, lance-memwal
        cells[(d["store"], d["keys"], d["window"])][system].append(d)
    columns = [
        ("rows/s", "rows_per_s", k, "higher"),
        ("persisted MB after close", "disk_bytes", mb, "lower"),
        ("objects written (PUTs; files on local)", "puts", count, "lower"),
        ("point read p50 ms", "p50", ms, "lower"),
        ("point read p99 ms", "p99", ms, "lower"),
    ]
    out = [stamp(lines)]
    for store in sorted({c[0] for c in cells}, key=lambda s: s != "local"):
        out.append(f"\n**{store}**\n")
        for title, name, fmt, better in columns:
            rows = []
            for cell in sorted(c for c in cells if c[0] == store):
                texts, meds = [], {}
                for system in KV_SYSTEMS:
                    text, meds[system] = summary(
                        [kv_metric(d, name) for d in cells[cell][system]], fmt)
                    texts.append(text)
                runs = min((len(v) for v in cells[cell].values() if v), default=0)
                rows.append([f"{cell[1]}, {cell[2]}", str(runs)] + texts
                            + [ratio(meds["memwal"], meds[p]) for p in KV_SYSTEMS[1:]])
            out.append(f"\n{title} ({better} is better):\n")
            out.append(table(["keys, window", "runs"] + KV_SYSTEMS
                             + ["memwal / slatedb", "memwal / lance"], rows))
    return "\n".join(out) + "\n"


# --- HNSW: benches/run_peers.sh --only hnsw -------------------------------------

HNSW_ENGINES = ["memwal", "faiss HNSWFlat", "hnswlib", "usearch"]


def at_ef(d, ef, field):
    return next((s[field] for s in d["search"] if s["ef"] == ef), None)


def hnsw(lines):
    cells = defaultdict(lambda: defaultdict(list))  # shape -> engine -> [line]
    for d in lines:
        cells[d["data"]][d["engine"]].append(d)
    out = [stamp(lines)]
    for shape in sorted(cells):
        rows, faiss = [], {}
        for engine in HNSW_ENGINES:
            runs = cells[shape][engine]
            build, build_med = summary([d["build_vectors_per_cpu_s"] for d in runs], count)
            q64, q64_med = summary([at_ef(d, 64, "queries_per_cpu_s") for d in runs], count)
            q32, _ = summary([at_ef(d, 32, "queries_per_cpu_s") for d in runs], count)
            r64 = summary([at_ef(d, 64, "recall") for d in runs], lambda v: f"{v:.4f}")[0]
            r32 = summary([at_ef(d, 32, "recall") for d in runs], lambda v: f"{v:.3f}")[0]
            if engine == "faiss HNSWFlat":
                faiss = {"build": build_med, "q64": q64_med}
            rows.append((engine, len(runs), build, build_med, q64, q64_med, r64, q32, r32))
        body = [[f"**{e}**" if e == "memwal" else e, str(n), b, q, r, f"{q32} ({r32})"]
                for e, n, b, _, q, _, r, q32, r32 in rows]
        memwal = rows[0]
        out.append(f"\n**{shape}** (memwal / faiss: build {ratio(memwal[3], faiss.get('build'))},"
                   f" search at ef = 64 {ratio(memwal[5], faiss.get('q64'))})\n")
        out.append(table(["engine", "runs", "build vectors per CPU-s",
                          "queries per CPU-s at ef = 64", "recall@10 at ef = 64",
                          "queries per CPU-s at ef = 32 (recall)"], body))
    return "\n".join(out) + "\n"


# --- catalog: benches/run_peers.sh --only catalog ------------------------------

def catalog(lines):
    cells = defaultdict(lambda: defaultdict(list))  # (entries, workers) -> system -> [line]
    for d in lines:
        cells[(d["entries"], d["workers"])][d["system"]].append(d)
    rows = []
    for cell in sorted(cells):
        m, l = cells[cell]["memwal"], cells[cell]["lance"]
        mo, mo_med = summary([d["ops_per_s"] for d in m], lambda v: f"{v:,.1f}")
        lo, lo_med = summary([d["ops_per_s"] for d in l], lambda v: f"{v:,.1f}")
        rows.append([f"{cell[0]:,}", str(cell[1]), str(min(len(m), len(l))), mo, lo,
                     ratio(mo_med, lo_med),
                     summary([d["p50_ms"] for d in m], ms)[0],
                     summary([d["p50_ms"] for d in l], ms)[0],
                     summary([d["p99_ms"] for d in m], ms)[0],
                     summary([d["p99_ms"] for d in l], ms)[0]])
    return stamp(lines) + "\n" + table(
        ["entries", "processes", "runs", "memwal commits/s", "Lance commits/s", "memwal / Lance",
         "memwal p50 ms", "Lance p50 ms", "memwal p99 ms", "Lance p99 ms"], rows) + "\n"


# --- shard writer: benches/run_peers.sh --only shard-writer --------------------

def shard_writer(lines):
    cells = defaultdict(list)  # (store, shape, batch, target, rows) -> [line]
    for d in lines:
        cells[(d["store"], d["shape"], d["batch"], d["target_rows_per_s"] or 0, d["rows"])].append(d)
    rows = []
    for cell in sorted(cells, key=lambda c: (c[0] != "local", c[1], -c[3], c[4], c[2])):
        runs = cells[cell]
        s = lambda f, fmt: summary([f(d) for d in runs], fmt)[0]  # noqa: E731
        length = f"{cell[4] // cell[3]} s" if cell[3] else f"{cell[4]:,} rows"
        rows.append([cell[0], cell[1], str(cell[2]), f"{cell[3]:,}" if cell[3] else "unpaced",
                     length, str(len(runs)),
                     s(lambda d: d["rows_per_s"], count),
                     s(lambda d: d["mb_per_s"], lambda v: f"{v:.1f}"),
                     s(lambda d: d["put_ms_p99"], lambda v: f"{v:.0f}"),
                     s(lambda d: d["slow_puts_1s"], count),
                     s(lambda d: d["wal_queue_final"]["share_of_run"], pct),
                     s(lambda d: d["wal_queue_max"]["share_of_run"], pct),
                     s(lambda d: d["wal_queue_max"]["seconds_of_target"], lambda v: f"{v:.2f}"),
                     s(lambda d: d["unacked_max"]["share_of_run"], pct),
                     s(lambda d: d["rows_per_cpu_second"], count)])
    return stamp(lines) + "\n" + table(
        ["store", "shape", "rows per put", "target rows/s", "length", "runs", "rows/s",
         "MB/s of Arrow batches",
         "put p99 ms", "puts ≥ 1 s", "WAL queue final (share of run)", "WAL queue max (share of run)",
         "WAL queue max (s of target)", "unacknowledged max (share of run)",
         "rows per CPU-s"], rows) + "\n"


# --- multimodal: benches/run_peers.sh --only multimodal ------------------------

def multimodal(lines):
    cells = defaultdict(lambda: defaultdict(list))  # (store, window) -> system -> [line]
    for d in lines:
        system = d["system"].split("-0")[0]
        if system == "memwal":
            system += " (" + d["embedding"] + ")"
        cells[(d["store"], d["window"])][system].append(d)
    systems = ["memwal (hnsw)", "memwal (bytes)", "slatedb"]
    columns = [
        ("rows/s", "rows_per_s", count, "higher"),
        ("MB/s of payload", "mb_per_s", lambda v: f"{v:,.1f}", "higher"),
        ("objects written until close (PUTs)", "objects_written", count, "lower"),
        ("persisted bytes / payload bytes", "persisted_over_payload", lambda v: f"{v:.3f}", "lower"),
    ]
    out = [stamp(lines)]
    for title, name, fmt, better in columns:
        rows = []
        for cell in sorted(cells, key=lambda c: (c[0] != "local", -c[1])):
            texts, meds = [], {}
            for system in systems:
                text, meds[system] = summary([d[name] for d in cells[cell][system]], fmt)
                texts.append(text)
            runs = min((len(v) for v in cells[cell].values() if v), default=0)
            rows.append([cell[0], str(cell[1]), str(runs)] + texts
                        + [ratio(meds["memwal (hnsw)"], meds["slatedb"]),
                           ratio(meds["memwal (bytes)"], meds["slatedb"])])
        out.append(f"\n{title} ({better} is better):\n")
        out.append(table(["store", "window", "runs"] + systems
                         + ["memwal (hnsw) / slatedb", "memwal (bytes) / slatedb"], rows))
    rows = []
    mbs = lambda v: f"{v:,.0f}"
    for cell in sorted(c for c in cells if c[0] == "local"):
        for system in systems[:2]:
            runs = cells[cell][system]
            rows.append([str(cell[1]), system] + [
                summary([d[key] for d in runs], fmt)[0] for key, fmt in [
                    ("mb_per_s", mbs), ("plain_files_mb_per_s", mbs),
                    ("mb_per_s_over_plain_files", pct), ("synced_mb_per_s", mbs),
                    ("plain_files_synced_mb_per_s", mbs),
                    ("synced_mb_per_s_over_plain_files", pct)]])
    out.append("\nLocal disk against plain files (the same payload, each put one file, the same "
               "window; the median of three in each run), until the writes return and until a "
               "sync after them returns:\n")
    out.append(table(["window", "system", "memwal MB/s", "plain files MB/s",
                      "memwal / plain files (per run)", "synced: memwal MB/s",
                      "plain files MB/s", "memwal / plain files (per run)"], rows))
    return "\n".join(out) + "\n"


# --- Python: benches/run_peers.sh --only python ---------------------------------

PYTHON_SYSTEMS = ["memwal-python", "memwal", "lance-memwal"]


def python(lines):
    cells = defaultdict(lambda: defaultdict(dict))  # window -> system -> run -> line
    for d in lines:
        system = d["system"].split(" ")[0].split("-0")[0]
        cells[d["window"]][system][d["run"]] = d
    rows = []
    for window in sorted(cells, reverse=True):
        texts, meds = [], {}
        for system in PYTHON_SYSTEMS:
            text, meds[system] = summary(
                [d["rows_per_s"] for d in cells[window][system].values()], k)
            texts.append(text)
        per_run = []
        for peer in PYTHON_SYSTEMS[1:]:
            ratios = [py["rows_per_s"] / cells[window][peer][run]["rows_per_s"]
                      for run, py in cells[window]["memwal-python"].items()
                      if run in cells[window][peer]]
            per_run.append(summary(ratios, lambda v: f"{v:.2f}×")[0])
        runs = min((len(v) for v in cells[window].values() if v), default=0)
        rows.append([str(window), str(runs)] + texts + per_run)
    return stamp(lines) + "\nrows/s of durable puts (higher is better); the ratios are per run " \
        "(median, min–max):\n\n" + table(
            ["window", "runs", "memwal Python `Table.put`", "memwal Rust `Table::put` (kv_bench)",
             "Lance MemWAL `ShardWriter.put` (pylance)", "Python / Rust", "Python / Lance"],
            rows) + "\n"


KINDS = {"kv": kv, "hnsw": hnsw, "catalog": catalog, "shard-writer": shard_writer,
         "multimodal": multimodal, "python": python}

p = argparse.ArgumentParser()
p.add_argument("results")
p.add_argument("--update")
args = p.parse_args()
name = os.path.basename(args.results)
kind = next((k for k in KINDS if name.startswith(k)), None)
if kind is None:
    sys.exit(f"{name}: not a results file of {', '.join(KINDS)}")
text = KINDS[kind](load(args.results))
if not args.update:
    print(text)
    sys.exit(0)
doc = open(args.update).read()
begin, end = f"<!-- {kind}:begin -->\n", f"<!-- {kind}:end -->"
if begin not in doc or end not in doc:
    sys.exit(f"{args.update} has no {begin.strip()} ... {end} section")
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
open(args.update, "w").write(head + begin + text + end + tail)
