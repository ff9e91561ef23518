#!/usr/bin/env python3
"""torch's ProcessGroupNCCL per-operation cost, the reference for the nccl backend
(scripts/gpu_check.sh): dist.all_reduce of a float CUDA tensor followed by
torch.cuda.synchronize(), the p50 over the calls, at world size N on one GPU (N > 1: one process
per rank, each with its own NCCL_HOSTID, so that NCCL treats them as separate hosts, as Loom's
checks do).

With --backend gloo: torch's gloo on float CPU tensors instead (the peer of Loom's shared-memory
and tcp paths, scripts/cpu_scale_check.sh), one process per rank, one intra-op thread each.

Usage: python3 bench/torch/nccl_ref.py N SIZES [--iters 50] [--backend nccl|gloo]
  SIZES: comma-separated bytes with K/M/G suffixes (8,64K,1M,16M)
Prints '# torch ...' then one line per size: 'SIZE_BYTES p50_us algbw_GBps busbw_GBps'.
Started from ../shared/gpu/torch_ref.py (nccl1).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def sizes_from(arg):
    out = []
    for s in arg.split(","):
        mult = 1
        if s[-1] in "KMG":
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[s[-1]]
            s = s[:-1]
        out.append(int(s) * mult)
    return out


def rank_main(rank, world, sizes, iters, port, q, backend):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if backend == "nccl":
        if world > 1:
            os.environ["NCCL_HOSTID"] = f"torchhost{rank}"
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=torch.device("cuda:0"))
        device = "cuda"
        sync = torch.cuda.synchronize
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        device = "cpu"

        def sync():
            pass
    lines = []
    for n in sizes:
        t = torch.ones(max(n // 4, 1), device=device)
        for _ in range(5):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        k = iters if n < (64 << 20) else max(iters // 5, 3)
        ts = []
        for _ in range(k):
            start = time.perf_counter()
            dist.all_reduce(t)
            sync()
            ts.append(time.perf_counter() - start)
        ts.sort()
        p50 = ts[len(ts) // 2]
        algbw = n / p50 / 1e9
        bus = algbw * (2 * (world - 1) / world if world > 1 else 1)
        lines.append(f"{n} {p50 * 1e6:.2f} {algbw:.2f} {bus:.2f}")
    if rank == 0:
        q.put(lines)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("world", type=int)
    parser.add_argument("sizes", type=sizes_from)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--port", type=int, default=29631)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    args = parser.parse_args()
    if args.backend == "nccl":
        print(f"# torch {torch.__version__}, cuda {torch.version.cuda}, nccl "
              f"{'.'.join(map(str, torch.cuda.nccl.version()))}, world {args.world}", flush=True)
    else:
        print(f"# torch {torch.__version__}, gloo on CPU tensors, world {args.world}", flush=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main,
                         args=(r, args.world, args.sizes, args.iters, args.port, q, args.backend))
             for r in range(args.world)]
    for p in procs:
        p.start()
    print("\n".join(q.get(timeout=240)), flush=True)
    for p in procs:
        p.join(60)


if __name__ == "__main__":
    main()
