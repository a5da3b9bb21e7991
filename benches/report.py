"""The KV comparison tables of BENCHMARKS.md, from the JSON lines that
benches/run_peers.sh writes: per cell (store, keys, window) and system, the
median of the runs with min-max, and memwal's ratio to each peer. Refuses a
line from a build with debug assertions.

    python3 benches/report.py benches/results/kv.jsonl [--update BENCHMARKS.md]

With --update, the text between `<!-- kv-peers:begin -->` and
`<!-- kv-peers:end -->` in that file is replaced; otherwise the tables are
printed.
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict

p = argparse.ArgumentParser()
p.add_argument("results")
p.add_argument("--update")
args = p.parse_args()

cells = defaultdict(lambda: defaultdict(list))  # (store, keys, window) -> system -> [line]
meta = {}
for n, line in enumerate(open(args.results), 1):
    d = json.loads(line)
    if d.get("debug_assertions"):
        sys.exit(f"{args.results}:{n}: {d['system']} was built with debug assertions; "
                 "rebuild with --release before publishing")
    system = d["system"].split(" ")[0].split("-0")[0]  # memwal, slatedb, lance-memwal
    cells[(d["store"], d["keys"], d["window"])][system].append(d)
    meta = {k: d[k] for k in ("commit", "date") if k in d} or meta

SYSTEMS = ["memwal", "slatedb", "lance-memwal"]


def metric(d, name):
    if name == "p50":
        return d.get("rust_get_p50_ms", d.get("get_p50_ms"))
    if name == "p99":
        return d.get("rust_get_p99_ms", d.get("get_p99_ms"))
    if name == "puts":
        r = d.get("requests_until_close")
        return r["put"]["requests"] if r else d.get("disk_files")
    return d[name]


def summary(lines, name, fmt):
    values = [v for v in (metric(d, name) for d in lines) if v is not None]
    if not values:
        return "—", None
    med = statistics.median(values)
    text = fmt(med)
    if len(values) > 1:
        text += f" ({fmt(min(values))}–{fmt(max(values))})"
    return text, med


def k(v):
    return f"{v / 1e3:,.1f} K"


def mb(v):
    return f"{v / 1e6:,.1f}"


def ms(v):
    return f"{v:.2f}"


def count(v):
    return f"{v:,.0f}"


COLUMNS = [
    ("rows/s", "rows_per_s", k, "higher"),
    ("persisted MB after close", "disk_bytes", mb, "lower"),
    ("objects written (PUTs; files on local)", "puts", count, "lower"),
    ("point read p50 ms", "p50", ms, "lower"),
    ("point read p99 ms", "p99", ms, "lower"),
]

out = []
if meta:
    out.append(f"Commit {meta.get('commit', '?')}, {meta.get('date', '?')}; "
               f"median of the runs (min–max), runs interleaved.\n")
for store in sorted({c[0] for c in cells}, key=lambda s: s != "local"):
    out.append(f"\n**{store}**\n")
    for title, name, fmt, better in COLUMNS:
        out.append(f"\n{title} ({better} is better):\n")
        out.append("| keys, window | runs | " + " | ".join(SYSTEMS)
                   + " | memwal / slatedb | memwal / lance |")
        out.append("|---|---|" + "---|" * (len(SYSTEMS) + 2))
        for cell in sorted(c for c in cells if c[0] == store):
            row, meds = [], {}
            for system in SYSTEMS:
                text, med = summary(cells[cell][system], name, fmt)
                row.append(text)
                meds[system] = med
            ratios = []
            for peer in SYSTEMS[1:]:
                a, b = meds["memwal"], meds[peer]
                r = a / b if a and b else None
                ratios.append("—" if r is None else f"{r:.2f}×" if r >= 0.1 else f"{r:.2g}×")
            runs = min((len(cells[cell][s]) for s in SYSTEMS if cells[cell][s]), default=0)
            out.append(f"| {cell[1]}, {cell[2]} | {runs} | " + " | ".join(row + ratios) + " |")
text = "\n".join(out) + "\n"

if not args.update:
    print(text)
    sys.exit(0)
doc = open(args.update).read()
begin, end = "<!-- kv-peers:begin -->\n", "<!-- kv-peers:end -->"
if begin not in doc or end not in doc:
    sys.exit(f"{args.update} has no {begin.strip()} ... {end} section")
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
open(args.update, "w").write(head + begin + text + end + tail)
