#!/usr/bin/env python3
"""Median of several scripts/peers.sh runs, one Markdown table per operation and world size.

On a shared 2-core machine one run of the same binary can differ from the next by 2x, so a
single run's ratio proves little. Run scripts/peers.sh N times (--out DIR1, DIR2, ...), then

    bench/peers/median_of_runs.py DIR1 DIR2 DIR3 [--stat p50|mean]

reads every run's compare_p50.md (or compare.md for --stat mean) and prints, per size, the
median busbw over the runs (with min-max) of loom tcp, the best Gloo algorithm, Open MPI tcp,
loom shm and Open MPI shm, and the median over runs of each run's own ratios: loom tcp / best
Gloo, loom tcp / Open MPI tcp, loom shm / Open MPI shm and loom shm / loom tcp. Ratios are of
busbw, so >1 means Loom is faster. A column whose series is missing prints "-". The optional
shared-memory series (peers.sh --only ... loom-win loom-tuned: "loom shm window", "loom shm
tuned") get a column and a ratio to Open MPI shm each when some run has them; the optional
tcp series ("loom tcp tuned", peers.sh --only ... loom-tcp-tuned) gets a column and its ratios
to the best Gloo algorithm and to Open MPI tcp.

The two "of limit" columns put each Loom cell against its physical limit, read from the same
runs' tcp_baseline.md and shm_baseline.md (medians over runs): from 64 KiB, busbw / one loopback
stream's rate (busy-polling) for tcp and busbw / memcpy's rate (1 thread) for shm; below, the
limit's time / Loom's time, with the 8-byte busy-polling TCP round trip and the shared-memory
flag round trip as the limits. 1.00 would be at the limit.

"tcp of ring" (from 64 KiB) compares loom tcp with raw sockets moving the same bytes: the
busbw a bandwidth-optimal algorithm would reach if every byte crossed the sockets at the rate
of tcp_baseline's ring of `world` streams (every process sending and receiving at once, 1 MiB
buffers, the better of blocking and busy-polling; the kernel copies each byte twice, on the
CPUs that also reduce). An all-reduce over n ranks puts 2(n-1)/n S through the sockets per rank
(S: nccl-tests' size) for a busbw of S 2(n-1)/n per second, an all-gather or reduce-scatter
(n-1)/n S for S (n-1)/n, so their busbw is at most aggregate / n at that rate; a broadcast puts
(n-1) S through them in all for a busbw of S, so aggregate / (n-1). The column is Loom's busbw
over that figure (median over runs). It is a yardstick, not a strict bound (the ring's
processes also wait on each other, and a collective can pass it slightly): near 1, moving the
bytes better gains little, and a peer near it cannot be beaten by much.
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
    """{(op, world, size, series): (busbw, time us)} from one loom-bench-compare Markdown file."""
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
                busbw, time = (float(v) for v in value.split(" / ")[:2])
                cells[(op, world, values["size"], series)] = (busbw, time)
    return cells


def limits(folder):
    """{name: value} from a run's tcp_baseline.md and shm_baseline.md (missing ones left out)."""
    found = {}
    patterns = {
        "stream GB/s": (r"one stream, 1 MiB writes, busy-polling \| ([\d.]+) GB/s", 1),
        "tcp rtt us": (r"8-byte round trip, busy-polling reads \(median / p99\) \| ([\d.]+)", 1),
        "memcpy GB/s": (r"memcpy, 256 MiB, 1 thread \| ([\d.]+) GB/s", 1),
        "flag rtt us": (r"flag round trip between two processes \(median / p99\) \| ([\d.]+)",
                        1e-3),
    }
    # The ring of n streams, 1 MiB buffers: the better of its blocking and busy-polling rates.
    tcp = Path(folder) / "tcp_baseline.md"
    if tcp.is_file():
        for m in re.finditer(r"ring of (\d+) streams, aggregate, (?:blocking|busy-polling), "
                             r"1 MiB buffers \| ([\d.]+) GB/s", tcp.read_text()):
            key = f"ring{m.group(1)} GB/s"
            found[key] = max(found.get(key, 0.0), float(m.group(2)))
    for name in ("tcp_baseline.md", "shm_baseline.md"):
        path = Path(folder) / name
        if not path.is_file():
            continue
        text = path.read_text()
        for key, (pattern, scale) in patterns.items():
            m = re.search(pattern, text)
            if m:
                found[key] = float(m.group(1)) * scale
    return found


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
    limit_runs = [limits(run) for run in args.runs]
    limit = {k: statistics.median([l[k] for l in limit_runs if k in l])
             for k in {k for l in limit_runs for k in l}}

    # Below 64 KiB a cell shows the time (us) and ratios are of speed (1 / time); from 64 KiB
    # it shows busbw. Either way a ratio > 1 means Loom is faster.
    def small(size):
        return size_bytes(size) < 64 * 1024

    def shown(cell_value, size):
        return cell_value[1] if small(size) else cell_value[0]

    def speed(cell_value, size):
        if small(size):
            return 1.0 / cell_value[1] if cell_value[1] > 0 else None
        return cell_value[0]

    def busbw(run, key):
        return speed(run[key], key[2]) if key in run else None

    def values(op, world, size, series):
        return [shown(r[(op, world, size, series)], size) for r in runs
                if (op, world, size, series) in r]

    def best_gloo_cell(run, op, world, size):
        gloo = [v for (o, w, s, series), v in run.items()
                if (o, w, s) == (op, world, size) and series.startswith("gloo")]
        return max(gloo, key=lambda v: speed(v, size) or 0) if gloo else None

    def best_gloo(run, op, world, size):
        best = best_gloo_cell(run, op, world, size)
        return speed(best, size) if best else None

    def cell(vs):
        if not vs:
            return "-"
        return f"{statistics.median(vs):.2f} ({min(vs):.2f}-{max(vs):.2f})"

    def ratio(pairs):
        rs = [a / b for a, b in pairs if a and b]
        if not rs:
            return "-"
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"

    def of_limit(op, world, size, series, bandwidth, latency):
        """Median over runs of the cell's fraction of its limit (see the module comment)."""
        small = size_bytes(size) < 64 * 1024
        key = latency if small else bandwidth
        if key not in limit:
            return "-"
        fs = []
        for r in runs:
            if (op, world, size, series) not in r:
                continue
            bw, time = r[(op, world, size, series)]
            if small and time > 0:
                fs.append(limit[key] / time)
            elif not small and bw > 0:
                fs.append(bw / limit[key])
        return f"{statistics.median(fs):.2f}" if fs else "-"

    def of_ring(op, world, size, series):
        """Median over runs of busbw / the ring-rate figure (see the module comment)."""
        key = f"ring{world} GB/s"
        if size_bytes(size) < 64 * 1024 or key not in limit or world < 2:
            return "-"
        figure = limit[key] / (world - 1 if op == "broadcast" else world)
        fs = [r[(op, world, size, series)][0] / figure for r in runs
              if (op, world, size, series) in r]
        return f"{statistics.median(fs):.2f}" if fs else "-"

    tables = sorted({(o, w) for r in runs for (o, w, _, _) in r})
    def present(name):
        return any(series == name for r in runs for (_, _, _, series) in r)

    optional = [name for name in ("loom shm window", "loom shm tuned") if present(name)]
    tcp_tuned = ["loom tcp tuned"] if present("loom tcp tuned") else []
    if limit:
        print("\nlimits (median over runs): " +
              ", ".join(f"{k} {v:.3g}" for k, v in sorted(limit.items())))
    for op, world in tables:
        sizes = sorted({s for r in runs for (o, w, s, _) in r if (o, w) == (op, world)},
                       key=size_bytes)
        print(f"\n### {op}, world size {world}: time us below 64 KiB, busbw GB/s from 64 KiB; "
              f"median of {len(runs)} runs ({args.stat} times; min-max)\n")
        extra_head = "".join(f" {name} | {name} / mpi shm |" for name in optional)
        extra_head += "".join(f" {name} | {name} / best gloo | {name} / mpi tcp |"
                              for name in tcp_tuned)
        print("| size | loom tcp | best gloo | mpi tcp | tcp / best gloo | tcp / mpi tcp | "
              "tcp of limit | tcp of ring | loom shm | mpi shm | shm / mpi shm | "
              "shm / tcp | shm of limit |" + extra_head)
        print("|---:" * (13 + 2 * len(optional) + 3 * len(tcp_tuned)) + "|")
        for size in sizes:
            key = (op, world, size)
            gloo = [shown(g, size) for g in (best_gloo_cell(r, *key) for r in runs) if g]
            tcp = [busbw(r, key + ("loom tcp",)) for r in runs]
            shm = [busbw(r, key + ("loom shm",)) for r in runs]
            mpi = [busbw(r, key + ("mpi shm",)) for r in runs]
            mpitcp = [busbw(r, key + ("mpi tcp",)) for r in runs]
            bests = [best_gloo(r, *key) for r in runs]
            print(f"| {size} | {cell(values(*key, 'loom tcp'))} | {cell(gloo)} | "
                  f"{cell(values(*key, 'mpi tcp'))} | {ratio(zip(tcp, bests))} | "
                  f"{ratio(zip(tcp, mpitcp))} | "
                  f"{of_limit(*key, 'loom tcp', 'stream GB/s', 'tcp rtt us')} | "
                  f"{of_ring(*key, 'loom tcp')} | "
                  f"{cell(values(*key, 'loom shm'))} | {cell(values(*key, 'mpi shm'))} | "
                  f"{ratio(zip(shm, mpi))} | {ratio(zip(shm, tcp))} | "
                  f"{of_limit(*key, 'loom shm', 'memcpy GB/s', 'flag rtt us')} |" +
                  "".join(f" {cell(values(*key, name))} | "
                          f"{ratio(zip([busbw(r, key + (name,)) for r in runs], mpi))} |"
                          for name in optional) +
                  "".join(f" {cell(values(*key, name))} | "
                          f"{ratio(zip([busbw(r, key + (name,)) for r in runs], bests))} | "
                          f"{ratio(zip([busbw(r, key + (name,)) for r in runs], mpitcp))} |"
                          for name in tcp_tuned))


if __name__ == "__main__":
    main()
