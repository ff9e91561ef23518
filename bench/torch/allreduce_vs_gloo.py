#!/usr/bin/env python3
"""torch.distributed all_reduce through backend "loom" vs "gloo", side by side in one run.

Every rank is a forked process holding both groups (the default group on loom, a second
group on gloo over the same ranks), so the two backends run on the same machine state. Each
round times every size on loom then gloo (the order alternates between rounds), and the table
gives the median over rounds of each round's mean time per all_reduce (the slowest rank's).
busbw = 2 (n - 1) / n * bytes / time, as nccl-tests and loom-bench report it.

With --ddp-steps, also torch DDP samples/s on the MLP 784-1024-1024-10 (batch 64 per rank,
one thread per rank), loom vs gloo, interleaved the same way.

With --loom-bench BIN_DIR (build/bin), every round also runs loom-bench through loom-run on
the same sizes with the same warm-up and iteration counts (in place, no check) while the torch
ranks wait, and the table adds its time and the torch path's ratio to it: what the binding
(the Python call, c10d's dispatch, the Work) adds to Loom itself; as the ratio of the medians,
and as the median of each round's own ratio (a round's torch loop and its loom-bench run are
back to back, so that ratio is the least exposed to the machine's slow phases), and as the
ratio of the fastest rounds (both paths in the machine's fast state: with more ranks than
CPUs, whole rounds of every implementation run 2-4x slower in a slow state that a round hits
or misses at random).

With --layers, every round also times the loom group's all_reduce through fewer of torch's
layers: the ProcessGroup's allreduce([t], opts).wait() called from Python (no dist.all_reduce
wrapper), and a C++ loop over ProcessGroupLoom's allreduce and wait (no Python, no c10d
dispatcher), and for each the time inside Loom's collective (start to end in the flight
record: loom_torch.flight_record). With --loom-bench too, the gaps between them say which layer
costs what.

Usage: PYTHONPATH=build/python python3 bench/torch/allreduce_vs_gloo.py [--world 2]
       [--rounds 3] [--sizes 8,65536,1048576,16777216,67108864] [--ddp-steps 30]
       [--loom-bench build/bin] [--window] [--layers] [--per-round]
On torch 2.x: PYTHONPATH=build/python-torch2 ~/.cache/loom/py/torch-2.15.0/bin/python ...
(the module built with -DLOOM_TORCH2_PYTHON, docs/torch.md).
"""

import argparse
import json
import queue as queue_module
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta


def iterations(nbytes):
    # about 0.1-0.5 s per size and backend on 2 cores (gloo's 64 MiB: about 0.6 s; gloo's
    # 64 KiB at 4 ranks: about 5 s). Loom's 64 KiB loop lasts ~10-50 ms: 200 calls were too few
    # to time it steadily.
    if nbytes <= 4096:
        return 2000
    if nbytes <= 64 << 10:
        return 1000
    if nbytes <= 1 << 20:
        return 200
    if nbytes <= 16 << 20:
        return 30
    return 12


def warmups(nbytes):
    return max(2, iterations(nbytes) // 10)


def loom_bench_times(bin_dir, world, sizes, tmp, window=False):
    """Mean time per in-place all-reduce (seconds) for each size: one loom-bench run per size
    through loom-run, with the torch loop's warm-up and iteration counts."""
    out = {}
    for size in sizes:
        doc = os.path.join(tmp, f"loom_bench_{size}.json")
        cmd = [os.path.join(bin_dir, "loom-run"), "--nproc-per-node", str(world), "--",
               os.path.join(bin_dir, "loom-bench"), "-b", str(size), "-e", str(size),
               "-n", str(iterations(size)), "-w", str(warmups(size)), "-c", "0",
               "--json", doc] + (["-R", "1"] if window else [])
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            sys.exit(f"loom-bench failed ({' '.join(cmd)}): exit {run.returncode}\n"
                     f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
        with open(doc) as f:
            out[size] = json.load(f)["results"][0]["in_place"]["time"] * 1e-6
    return out


def human(nbytes):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def parse_size(text, flag="--sizes"):
    """'65536', '64K', '1M', '1G' (binary) -> bytes; anything else is an error naming it."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = units.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in units else t
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{flag}: '{text}' is not a byte count (65536, 64K, 1M)")
    return int(digits) * scale


# --layers: the loom group's all_reduce through successively fewer of torch's layers.
LAYERS = {
    "loom-pg": "the ProcessGroup's allreduce([t], opts).wait() from Python (no dist.all_reduce)",
    "loom-cpp": "ProcessGroupLoom's allreduce and wait from a C++ loop (no Python, no dispatcher)",
}


def runner(name, group, t):
    """A function of k that runs k all_reduces of `t` the way series `name` calls them."""
    import torch.distributed as dist

    if name in ("loom", "gloo"):
        def through_dist(k):
            for _ in range(k):
                dist.all_reduce(t, group=group)
        return through_dist
    pg = dist.distributed_c10d._get_default_group()
    if name == "loom-pg":
        opts = dist.AllreduceOptions()

        def through_pg(k):
            for _ in range(k):
                pg.allreduce([t], opts).wait()
        return through_pg
    import loom_torch
    return lambda k: loom_torch._C._allreduce_loop(pg, t, k)


def inside_loom(name, size, n):
    """Mean seconds from start to end of the last n all-reduces of `size` bytes in this rank's
    flight record (the time inside Loom's collective, without the call path around it), over
    those the recorder timed exactly; 0 for gloo or when none was (below 64 KiB only every
    256th operation is, docs/diagnostics.md)."""
    if name == "gloo":
        return 0.0
    import loom_torch

    nbytes = max(4, size // 4 * 4)
    entries = sorted((e for e in loom_torch.flight_record()["entries"] if e["op"] == "allreduce"),
                     key=lambda e: e["seq"])[-n:]
    spans = [e["end_us"] - e["start_us"] for e in entries
             if e["bytes"] == nbytes and e.get("precise") and e.get("end_us")]
    return statistics.mean(spans) * 1e-6 if spans else 0.0


def rank_main(rank, world, tmp, args, queue, resume):
    import torch
    import torch.distributed as dist

    import loom_torch

    torch.set_num_threads(1)
    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    # The series: each backend through dist.all_reduce, and with --layers the loom group's
    # lower layers (see LAYERS).
    series = ["loom"] + (list(LAYERS) if args.layers else []) + ["gloo"]
    sizes = args.sizes
    times = {(b, s): [] for b in series for s in sizes}
    inside = {(b, s): [] for b in series if b != "gloo" for s in sizes}
    for rnd in range(args.rounds):
        order = series if rnd % 2 == 0 else list(reversed(series))
        for size in sizes:
            for name in order:
                backend = "gloo" if name == "gloo" else "loom"
                group = groups[backend]
                if backend == "loom" and args.window:
                    t = loom_torch.empty(max(1, size // 4), dtype=torch.float32).fill_(1)
                else:
                    t = torch.ones(max(1, size // 4), dtype=torch.float32)
                n = iterations(size)
                run = runner(name, group, t)
                run(warmups(size))
                dist.barrier(group=group)
                start = time.perf_counter()
                run(n)
                # The slowest rank's time; the least time inside Loom of any rank (the others'
                # include waiting for that rank to arrive).
                elapsed = torch.tensor([(time.perf_counter() - start) / n,
                                        -inside_loom(name, size, n) if args.layers else 0.0],
                                       dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[(name, size)].append(elapsed[0].item())
                if args.layers and name != "gloo":
                    inside[(name, size)].append(-elapsed[1].item())
        if args.loom_bench:
            # The parent runs loom-bench now, with this job idle; every rank waits for it.
            if rank == 0:
                queue.put(("round", rnd))
            if not resume[rnd].wait(timeout=1200):
                raise RuntimeError(f"rank {rank}: loom-bench round {rnd} did not end in 20 min")
    ddp = {}
    if args.ddp_steps > 0:
        ddp = ddp_samples_per_second(rank, world, groups, args)
    if rank == 0:
        queue.put(("done", (times, inside, ddp, loom_torch.transport_summary())))


def ddp_samples_per_second(rank, world, groups, args):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    result = {b: [] for b in groups}
    models = {}
    for backend, group in groups.items():
        net = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                  torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                  torch.nn.Linear(1024, 10))
        model = DDP(net, process_group=group)
        models[backend] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    for rnd in range(args.rounds):
        order = list(groups) if rnd % 2 == 0 else list(reversed(groups))
        for backend in order:
            model, opt = models[backend]
            for step in range(args.ddp_steps + 3):
                if step == 3:
                    start = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            result[backend].append(64 * world * args.ddp_steps / (time.perf_counter() - start))
    return result


def print_layers(args, sizes, times, inside, bench):
    """The --layers tables: each loom series' time per call (with --loom-bench, in brackets the
    median of the rounds' own ratios to loom-bench), then its time inside Loom's collective."""
    ratios = "; in brackets the median of the rounds' own ratios to loom-bench" \
        if args.loom_bench else ""
    names = ("loom",) + tuple(LAYERS) + (("loom-bench",) if args.loom_bench else ())

    def table(title, cell):
        print(f"\n# {title}")
        print("| size | " + " | ".join(names) + " |")
        print("|---:|" + "---:|" * len(names))
        for size in sizes:
            print(f"| {human(size)} | " + " | ".join(cell(n, size) for n in names) + " |")

    def time_cell(name, size):
        series = bench[size] if name == "loom-bench" else times[(name, size)]
        cell = f"{statistics.median(series) * 1e6:.1f} us"
        if args.loom_bench and name != "loom-bench":
            cell += f" ({statistics.median(t / b for t, b in zip(series, bench[size])):.2f})"
        return cell

    def inside_cell(name, size):
        spans = bench[size] if name == "loom-bench" else inside[(name, size)]
        return f"{statistics.median(spans) * 1e6:.1f} us" if spans and min(spans) > 0 else "-"

    table(f"loom's all_reduce through fewer layers (median of {args.rounds} rounds{ratios})\n"
          + "\n".join(f"# {name}: {LAYERS.get(name, 'dist.all_reduce(t)')}"
                      for name in ("loom",) + tuple(LAYERS)), time_cell)
    table("the same calls' time inside Loom's collective (flight recorder: start to end, mean "
          "per rank, the least of any rank: the others' include waiting for it to arrive; "
          "loom-bench: its whole time)", inside_cell)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="8,64K,1M,16M,64M",
                        type=lambda v: [parse_size(s) for s in v.split(",")],
                        help="comma-separated byte counts (65536, 64K, 1M)")
    parser.add_argument("--ddp-steps", type=int, default=0)
    parser.add_argument("--loom-bench", metavar="BIN_DIR", default="",
                        help="directory with loom-run and loom-bench: adds loom-bench's time")
    parser.add_argument("--window", action="store_true",
                        help="loom's tensors are Loom windows (loom_torch.empty; loom-bench -R 1)")
    parser.add_argument("--layers", action="store_true",
                        help="also time loom's all_reduce through fewer of torch's layers: "
                             "pg.allreduce().wait() from Python, and a C++ loop")
    parser.add_argument("--per-round", action="store_true",
                        help="also print every round's time per size and backend (us)")
    args = parser.parse_args()
    if args.loom_bench:
        for program in ("loom-run", "loom-bench"):
            if not os.access(os.path.join(args.loom_bench, program), os.X_OK):
                parser.error(f"--loom-bench: no executable {program} in '{args.loom_bench}'")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="loom_torch_bench_") as tmp:
        resume = [ctx.Event() for _ in range(args.rounds)]
        procs = [ctx.Process(target=rank_main, args=(r, args.world, tmp, args, queue, resume))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        # Wait for rank 0's results while every rank lives: a rank that dies ends the run at once
        # (the whole run is bounded too).
        deadline = time.monotonic() + 1800
        bench = {s: [] for s in args.sizes}
        while True:
            try:
                kind, payload = queue.get(timeout=1)
                if kind == "round":
                    for size, t in loom_bench_times(args.loom_bench, args.world, args.sizes,
                                                    tmp, args.window).items():
                        bench[size].append(t)
                    resume[payload].set()
                    continue
                times, inside, ddp, transport = payload
                break
            except queue_module.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    for p in procs:
                        p.kill()
                    sys.exit(f"a rank failed or the run passed 30 min: exit codes "
                             f"{[p.exitcode for p in procs]}")
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            sys.exit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")

    n = args.world
    memory = ", loom tensors in Loom windows" if args.window else ""
    print(f"# torch.distributed all_reduce (float32, sum), {n} ranks, loom over {transport}{memory}; "
          f"median of {args.rounds} interleaved rounds; {os.cpu_count()} CPUs")
    header = "| size | loom time | gloo time | loom busbw | gloo busbw | gloo/loom time |"
    rule = "|---:|---:|---:|---:|---:|---:|"
    if args.loom_bench:
        header += (" loom-bench time | loom / loom-bench | median of round ratios |"
                   " fastest rounds' ratio |")
        rule += "---:|---:|---:|---:|"
    print(header)
    print(rule)
    sizes = sorted({s for _, s in times})
    for size in sizes:
        nbytes = max(4, size // 4 * 4)
        row = {}
        for backend in ("loom", "gloo"):
            t = statistics.median(times[(backend, size)])
            row[backend] = (t, 2 * (n - 1) / n * nbytes / t / 1e9)
        line = (f"| {human(size)} | {row['loom'][0] * 1e6:.1f} us | "
                f"{row['gloo'][0] * 1e6:.1f} us | {row['loom'][1]:.2f} GB/s | "
                f"{row['gloo'][1]:.2f} GB/s | {row['gloo'][0] / row['loom'][0]:.1f}x |")
        if args.loom_bench:
            b = statistics.median(bench[size])
            # Each round's torch loop and its loom-bench run are back to back: the ratio within
            # a round is the least exposed to the VM's slow phases.
            paired = statistics.median(t / bb for t, bb in zip(times[("loom", size)], bench[size]))
            # The fastest round of each: both paths in the machine's fast state (on 2 CPUs with
            # more ranks than CPUs, whole rounds of every implementation, Open MPI's included,
            # run 2-4x slower in a slow state that a round either hits or misses; docs/torch.md).
            fastest = min(times[("loom", size)]) / min(bench[size])
            line += (f" {b * 1e6:.1f} us | {row['loom'][0] / b:.2f} | {paired:.2f} |"
                     f" {fastest:.2f} |")
        print(line)
    if args.layers:
        print_layers(args, sizes, times, inside, bench)
    if args.per_round:
        print("\n# every round's mean time per all_reduce (us), in round order")
        for size in sizes:
            for backend in ("loom",) + (tuple(LAYERS) if args.layers else ()) + ("gloo",):
                print(f"# {human(size)} {backend}: "
                      + " ".join(f"{t * 1e6:.1f}" for t in times[(backend, size)]))
            if args.loom_bench:
                print(f"# {human(size)} loom-bench: "
                      + " ".join(f"{t * 1e6:.1f}" for t in bench[size]))
    if ddp:
        print(f"\n# torch DDP, MLP 784-1024-1024-10, batch 64 per rank, {n} ranks, "
              f"{args.ddp_steps} steps per round, median of {args.rounds} rounds")
        print("| backend | samples/s |")
        print("|---|---:|")
        for backend in ("loom", "gloo"):
            print(f"| {backend} | {statistics.median(ddp[backend]):.0f} |")


if __name__ == "__main__":
    main()
