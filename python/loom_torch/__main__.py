"""python -m loom_torch: the versions, Loom's transports and a self-test.

The self-test forks WORLD ranks (default 2) that form a "loom" group over a file:// rendezvous
and all-reduce float32, float64 and int64 tensors of 1, 1000 and 2^20 elements (4 B of
float32 to 8 MiB of float64 and int64) in which rank r holds
(r + 1) * (i + 1) at index i; every rank checks the sum against the closed form
(i + 1) * WORLD * (WORLD + 1) / 2. Exit status 0 when every rank passed, 1 otherwise.
"""

import argparse
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import loom_torch

# Elements per all_reduce: 8 B of float64, a few KiB, 4 MiB of float32 (the large-message path).
SIZES = (1, 1000, 1 << 20)
DTYPES = (torch.float32, torch.float64, torch.int64)


def _rank(rank, world, init_file, timeout_s, results):
    try:
        dist.init_process_group(loom_torch.BACKEND, init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        checked = 0
        for dtype in DTYPES:
            for n in SIZES:
                index = torch.arange(1, n + 1, dtype=torch.float64)
                t = (index * (rank + 1)).to(dtype)
                dist.all_reduce(t)
                expect = (index * (world * (world + 1) // 2)).to(dtype)
                if not torch.equal(t, expect):
                    bad = int((t != expect).nonzero()[0])
                    raise AssertionError(f"all_reduce of {n} {dtype}: element {bad} is "
                                         f"{t[bad].item()}, expected {expect[bad].item()}")
                checked += 1
        summary = loom_torch.transport_summary()
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, "", checked, summary))
    except BaseException as e:  # reported by the parent, which names the rank
        results.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}", 0, ""))


def self_test(world, timeout_s):
    """Runs the self-test; returns (passed, one line saying what happened)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="loom_torch_selftest_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        start = time.monotonic()
        procs = [ctx.Process(target=_rank, args=(r, world, init_file, timeout_s, results))
                 for r in range(world)]
        for p in procs:
            p.start()
        got = {}
        deadline = start + timeout_s + 30
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, error, checked, summary = results.get(timeout=0.5)
                got[rank] = (error, checked, summary)
            except Exception:  # queue.Empty: check whether a rank died without reporting
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in got]
                if dead:
                    time.sleep(1)  # a rank that failed reports before it exits; give it a moment
                    while not results.empty():
                        rank, error, checked, summary = results.get()
                        got[rank] = (error, checked, summary)
                    for r in dead:
                        if r not in got:
                            got[r] = (f"rank {r} exited with status {procs[r].exitcode} "
                                      "without a result", 0, "")
        elapsed = time.monotonic() - start
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    missing = [r for r in range(world) if r not in got]
    failed = {r: got[r][0] for r in sorted(got) if got[r][0]}
    what = (f"all_reduce over \"loom\", {world} ranks, {len(DTYPES)} dtypes x {len(SIZES)} sizes "
            "(up to 8 MiB) against the closed form")
    if missing:
        return False, f"FAIL: {what}: ranks {missing} gave no result within {timeout_s + 30:.0f} s"
    if failed:
        first = min(failed)
        return False, f"FAIL: {what}: rank {first}: {failed[first]}"
    transports = got[0][2]
    return True, f"PASS: {what}, {got[0][1]} checks per rank, over {transports}, {elapsed:.2f} s"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m loom_torch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks in the self-test (2)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds the self-test's group waits for a peer (60)")
    parser.add_argument("--no-self-test", action="store_true", help="print versions only")
    args = parser.parse_args(argv)
    if args.world < 1:
        parser.error(f"--world must be at least 1, got {args.world}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")

    print(f"loom_torch {loom_torch.LOOM_VERSION} ({os.path.dirname(loom_torch.__file__)})")
    print(f"torch {torch.__version__} (the module is built against {loom_torch.TORCH_BUILT_WITH}), "
          f"Python {platform.python_version()}")
    for name, why in loom_torch._C._transports():
        state = "available" if not why else f"not available: {why}"
        note = " (the loom backend's: shared memory between ranks on one host)" if name == "tcp" \
            else ""
        print(f"Loom transport {name}: {state}{note}")
    if args.no_self_test:
        return 0
    passed, line = self_test(args.world, args.timeout)
    print(f"self-test: {line}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
