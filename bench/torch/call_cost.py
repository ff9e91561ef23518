#!/usr/bin/env python3
"""What one call into the loom backend costs on this CPU, warm and after a copy that cycles the
caches: dist.all_reduce of an 8-byte tensor on a one-rank loom group, and the same all-reduce
from a C++ loop (loom_torch._C._allreduce_loop: ProcessGroupLoom's own path, no Python, no
c10d dispatcher).

A large all-reduce streams several MiB through each rank's caches, so the next call's Python
and c10d code runs from farther away. This script measures that without other ranks: each
round times a loop of `copy; call` against a loop of `copy` alone (the copy of --evict bytes
between two tensors, the same in both) and a loop of `call` alone; the call's cost after the
copy is the difference. Rounds interleave the loops; the table gives the medians.

Usage: PYTHONPATH=build/python python3 bench/torch/call_cost.py [--evict 256K,4M]
       [--rounds 11] [--calls 3000]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from allreduce_vs_gloo import parse_size  # this directory is the script's: on sys.path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--evict", default="256K,4M",
                        type=lambda v: [parse_size(s, "--evict") for s in v.split(",")],
                        help="comma-separated sizes of the copy between calls (256K, 4M)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=3000, help="calls per timed loop")
    args = parser.parse_args()
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")

    import torch
    import torch.distributed as dist

    import loom_torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="loom_call_cost_") as tmp:
        dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        pg = dist.distributed_c10d._get_default_group()
        small = torch.ones(2)

        def per_call(fn):
            for _ in range(min(200, args.calls)):
                fn()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            return (time.perf_counter() - start) / args.calls * 1e6

        def python_call():
            dist.all_reduce(small)

        def cpp_call():
            loom_torch._C._allreduce_loop(pg, small, 1)

        print(f"# one call of an 8-byte all_reduce on a one-rank loom group (us, median of "
              f"{args.rounds} rounds of {args.calls} calls); {os.cpu_count()} CPUs")
        print("| copy between calls | dist.all_reduce warm | after the copy | "
              "C++ loop warm | after the copy |")
        print("|---:|---:|---:|---:|---:|")
        for nbytes in args.evict:
            a = torch.ones(max(1, nbytes // 4))
            b = torch.ones_like(a)
            rows = []
            for _ in range(args.rounds):
                copy = per_call(lambda: a.copy_(b))
                rows.append((
                    per_call(python_call),
                    per_call(lambda: (a.copy_(b), python_call())) - copy,
                    per_call(cpp_call),
                    per_call(lambda: (a.copy_(b), cpp_call())) - copy,
                ))
            med = [statistics.median(r[i] for r in rows) for i in range(4)]
            size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
            print(f"| {size} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} |")
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
