#!/usr/bin/env python3
"""Counts the cells of a peers table (scripts/peers.sh's DIR/median.md, or a docs/results page
made from one) that meet issue 19's
targets from 64 KiB: tcp at least 1.5x Gloo's best and 1.2x Open MPI over tcp, with the built-in
choice and with the better of it and the tuned tcp series; shared memory at least 1.5x Open
MPI's vader, with the default (staged) series and with the best of the staged, window and tuned
series. Prints a Markdown table (cells met per operation and world size) and,
per target, the cells below it with their ratio, then the 8-byte all-reduce cells slower than
Open MPI (issue 19's latency target: at or below Open MPI over tcp and over shared memory).
profile_cells.py imports evaluate() to profile the cells below target.

Usage: bench/peers/targets.py DIR/median.md
"""

import re
import sys

MIN_BYTES = 64 << 10
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_bytes(text):
    number, unit = text.split()
    return int(float(number) * UNITS[unit])


def ratio(text):
    """'1.52x' or '1.52x (1.40-1.60)' -> 1.52; '' or '-' -> None (a series that did not run)."""
    text = text.split("(")[0].strip().rstrip("x")
    try:
        return float(text)
    except ValueError:
        return None


def section_title(line):
    """'### all_gather, world size 2: ...' (median.md) or '**all-gather, 2 ranks** ...' (a
    docs/results page) -> 'all-gather, 2 ranks'; None for other lines."""
    m = re.match(r"### (\w+), world size (\d+)", line)
    if m:
        return f"{m.group(1).replace('_', '-')}, {m.group(2)} ranks"
    m = re.match(r"\*\*(.+?, \d+ ranks)\*\*", line)
    return m.group(1) if m else None


def sections(lines):
    """Yields (title, header cells, rows of cells) for every table under a section title."""
    title = None
    header = None
    rows = []
    for line in lines + [""]:
        t = section_title(line)
        if t:
            title, header, rows = t, None, []
            continue
        if title and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = [ALIASES.get(c, c) for c in cells]
            elif not set("".join(cells)) <= set("-: "):
                rows.append(cells)
            continue
        if title and header and rows:
            yield title, header, rows
            title, header, rows = None, None, []


TARGETS = [
    ("tcp ≥ 1.5x gloo", ["loom÷gloo"], 1.5),
    ("tcp ≥ 1.5x gloo (best of built-in, tuned)", ["loom÷gloo", "tcp tuned÷gloo"], 1.5),
    ("tcp ≥ 1.2x mpi tcp", ["loom÷mpi tcp"], 1.2),
    ("tcp ≥ 1.2x mpi tcp (best of built-in, tuned)", ["loom÷mpi tcp", "tcp tuned÷mpi tcp"], 1.2),
    ("shm ≥ 1.5x vader (staged)", ["loom÷mpi shm"], 1.5),
    ("shm ≥ 1.5x vader (best of staged, window, tuned)",
     ["loom÷mpi shm", "window÷mpi shm", "tuned÷mpi shm"], 1.5),
]
# Issue 19's latency target: the 8-byte all-reduce at or below Open MPI (time ratio >= 1).
LATENCY_TARGETS = ["8 B tcp ≤ mpi tcp", "8 B shm ≤ mpi shm"]
# median.md's names for the same columns (median_of_runs.py).
ALIASES = {
    "tcp / best gloo": "loom÷gloo",
    "tcp / mpi tcp": "loom÷mpi tcp",
    "shm / mpi shm": "loom÷mpi shm",
    "loom shm window / mpi shm": "window÷mpi shm",
    "loom shm tuned / mpi shm": "tuned÷mpi shm",
    "loom tcp tuned / best gloo": "tcp tuned÷gloo",
    "loom tcp tuned / mpi tcp": "tcp tuned÷mpi tcp",
}


def latency_rows(title, header, rows):
    """The 8-byte all-reduce cells of issue 19's latency target (Loom at or below Open MPI,
    over tcp and over shared memory): [(target name, ratio or None, row)]. A time ratio above
    1 means Loom was faster (median_of_runs.py: the peer's time over Loom's, per round)."""
    if not title.startswith("all-reduce"):
        return []
    out = []
    for r in rows:
        if size_bytes(r[0]) != 8:
            continue
        for name, column in (("8 B tcp ≤ mpi tcp", "loom÷mpi tcp"),
                             ("8 B shm ≤ mpi shm", "loom÷mpi shm")):
            if column in header:
                out.append((name, ratio(r[header.index(column)]), r))
    return out


def evaluate(lines):
    """Counts the targets over a table's lines. Returns (counts, misses, absent): counts is
    [(title, cells, [met or None per target])]; misses maps a target's name to the cells below
    it, each a dict with title, op, ranks, size (as printed), bytes, best (the best ratio or
    None), series (the column that gave it), ring (the "tcp of ring" yardstick or None) and
    cells (the row, by column name);
    absent is the set of series the table lacks."""
    counts = []
    misses = {name: [] for name, _, _ in TARGETS}
    misses.update({name: [] for name in LATENCY_TARGETS})
    absent = set()
    for title, header, rows in sections(lines):
        op, ranks = title.split(", ")
        ranks = int(ranks.split()[0])

        def miss(name, r, best, series):
            ring = None
            if name.startswith("tcp") and "tcp of ring" in header:
                ring = r[header.index("tcp of ring")]
            misses[name].append({"title": title, "op": op, "ranks": ranks, "size": r[0],
                                 "bytes": size_bytes(r[0]), "best": best, "series": series,
                                 "ring": ring, "cells": dict(zip(header, r))})

        for name, value, r in latency_rows(title, header, rows):
            if value is not None and value < 1.0:
                miss(name, r, value, "loom÷mpi tcp" if "tcp" in name else "loom÷mpi shm")
        cells = [r for r in rows if size_bytes(r[0]) >= MIN_BYTES]
        met = []
        for name, wanted, bound in TARGETS:
            # The first column is required; the window and tuned series are optional (a run
            # without those families): the best is taken over the series the table has.
            if wanted[0] not in header:
                sys.exit(f"table '{title}' has no column {wanted[0]!r}")
            columns = [c for c in wanted if c in header]
            absent.update(c for c in wanted if c not in header)
            if all(ratio(r[header.index(wanted[0])]) is None for r in cells):
                # The series did not run (peers.sh --only without it): no count, no misses.
                absent.add(wanted[0])
                met.append(None)
                continue
            n = 0
            for r in cells:
                values = [(ratio(r[header.index(c)]), c) for c in columns]
                values = [v for v in values if v[0] is not None]
                best, series = max(values) if values else (None, wanted[0])
                if best is not None and best >= bound:
                    n += 1
                else:
                    miss(name, r, best, series)
            met.append(n)
        counts.append((title, len(cells), met))
    return counts, misses, absent


def describe(m):
    shown = f"{m['best']:.2f}x" if m["best"] is not None else "no figure"
    # TCP: how close Loom already is to raw sockets moving its bytes (median_of_runs.py's
    # "tcp of ring"), where the table has it.
    if m["ring"] is not None:
        shown += f" (loom tcp at {m['ring']} of the ring)"
    return f"{m['title']} {m['size']}: {shown}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        lines = f.read().splitlines()
    counts, misses, absent = evaluate(lines)
    if not counts:
        sys.exit(f"{sys.argv[1]}: no per-operation tables found")
    print("| op, ranks | cells from 64 KiB | " + " | ".join(n for n, _, _ in TARGETS) + " |")
    print("|---|---:|" + "---:|" * len(TARGETS))
    for title, n, met in sorted(counts):
        print(f"| {title.replace(' ranks', '')} | {n} | " +
              " | ".join("-" if m is None else str(m) for m in met) + " |")
    total = sum(n for _, n, _ in counts)
    sums = []
    for i in range(len(TARGETS)):
        known = [m[i] for _, _, m in counts if m[i] is not None]
        sums.append(f"**{sum(known)}**" if known else "-")
    print(f"| **all** | {total} | " + " | ".join(sums) + " |")
    if absent:
        print(f"\n(Series not in this table or without figures, left out of the counts ('-' "
              f"where a target's own series is missing): {', '.join(sorted(absent))}.)")
    for name in [n for n, _, _ in TARGETS] + LATENCY_TARGETS:
        print(f"\nBelow '{name}':")
        for m in misses[name]:
            print(f"- {describe(m)}")


if __name__ == "__main__":
    main()
