#!/usr/bin/env python3
"""Median of several scripts/peers.sh runs, one Markdown table per operation and world size.

On a shared 2-core machine one run of the same binary can differ from the next by 2x, so a
single run's ratio proves little. Run scripts/peers.sh N times (--out DIR1, DIR2, ...), then

    bench/peers/median_of_runs.py DIR1 DIR2 DIR3 [--stat p50|mean]

reads every run's compare_p50.md (or compare.md for --stat mean) and prints, per size, the
median busbw over the runs (with min-max) of loom tcp, the best Gloo algorithm, loom shm, Open
MPI shm and Open MPI tcp, and the median over runs of each run's own ratios: loom tcp / best
Gloo (issue 5's target), loom shm / Open MPI shm and loom shm / loom tcp (issue 8's). Ratios
are of busbw, so >1 means Loom is faster. A column whose series is missing prints "-".
"""
import argparse
import re
import statistics
import sys
from pathlib import Path

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_bytes(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


def parse(path):
    """{(op, world, size, series): busbw} from one loom-bench-compare Markdown file."""
    cells = {}
    for section in path.read_text().split("### ")[1:]:
        lines = section.strip().split("\n")
        m = re.match(r"(\w+), world size (\d+)", lines[0])
        if not m or len(lines) < 4:
            continue
        op, world = m.group(1), int(m.group(2))
        header = [h.strip() for h in lines[2].strip("|").split("|")]
        for row in lines[4:]:
            if not row.startswith("|"):
                continue
            values = dict(zip(header, (c.strip() for c in row.strip("|").split("|"))))
            for series, value in values.items():
                # busbw / time cells; ratio columns are named "a / b" and hold "1.23x".
                if " / " in series or " / " not in value:
                    continue
                cells[(op, world, values["size"], series)] = float(value.split(" / ")[0])
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="results folders written by scripts/peers.sh --out")
    ap.add_argument("--stat", choices=["p50", "mean"], default="p50")
    args = ap.parse_args()
    name = "compare_p50.md" if args.stat == "p50" else "compare.md"
    runs = []
    for run in args.runs:
        path = Path(run) / name
        if not path.is_file():
            sys.exit(f"median_of_runs: {path} does not exist (expected a scripts/peers.sh folder)")
        runs.append(parse(path))

    def values(op, world, size, series):
        return [r[(op, world, size, series)] for r in runs if (op, world, size, series) in r]

    def best_gloo(run, op, world, size):
        gloo = [v for (o, w, s, series), v in run.items()
                if (o, w, s) == (op, world, size) and series.startswith("gloo")]
        return max(gloo) if gloo else None

    def cell(vs):
        if not vs:
            return "-"
        return f"{statistics.median(vs):.2f} ({min(vs):.2f}-{max(vs):.2f})"

    def ratio(pairs):
        rs = [a / b for a, b in pairs if a and b]
        if not rs:
            return "-"
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"

    tables = sorted({(o, w) for r in runs for (o, w, _, _) in r})
    for op, world in tables:
        sizes = sorted({s for r in runs for (o, w, s, _) in r if (o, w) == (op, world)},
                       key=size_bytes)
        print(f"\n### {op}, world size {world}: busbw GB/s, median of {len(runs)} runs "
              f"({args.stat} times; min-max)\n")
        print("| size | loom tcp | best gloo | loom tcp / best gloo | loom shm | mpi shm | "
              "loom shm / mpi shm | loom shm / loom tcp | mpi tcp |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for size in sizes:
            gloo = [g for g in (best_gloo(r, op, world, size) for r in runs) if g]
            tcp = [r.get((op, world, size, "loom tcp")) for r in runs]
            shm = [r.get((op, world, size, "loom shm")) for r in runs]
            mpi = [r.get((op, world, size, "mpi shm")) for r in runs]
            bests = [best_gloo(r, op, world, size) for r in runs]
            print(f"| {size} | {cell(values(op, world, size, 'loom tcp'))} | {cell(gloo)} | "
                  f"{ratio(zip(tcp, bests))} | {cell(values(op, world, size, 'loom shm'))} | "
                  f"{cell(values(op, world, size, 'mpi shm'))} | {ratio(zip(shm, mpi))} | "
                  f"{ratio(zip(shm, tcp))} | {cell(values(op, world, size, 'mpi tcp'))} |")


if __name__ == "__main__":
    main()
