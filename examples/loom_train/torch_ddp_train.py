#!/usr/bin/env python3
"""PyTorch DDP (gloo) counterpart of loom-train for throughput comparisons: the same MLP
(Sequential(Linear, ReLU, ..., Linear)), SGD, --batch per rank, one thread per rank, synthetic
data. Spawns --nproc ranks itself and prints samples/s over the steps after the first.

  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
    python3 torch_ddp_train.py --nproc 2 --batch 64 --steps 100
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def build(args):
    sizes = [args.inp] + [int(h) for h in args.hidden.split(",") if h] + [args.classes]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    world = args.nproc
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = build(args)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.samples, args.inp, generator=g)
    y = torch.randint(0, args.classes, (args.samples,), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    start = None
    for step in range(args.steps):
        i = (step * args.batch) % (args.samples - args.batch)
        opt.zero_grad()
        loss = loss_fn(model(x[i:i + args.batch]), y[i:i + args.batch])
        loss.backward()
        opt.step()
        if step == 0:
            start = time.perf_counter()
    elapsed = time.perf_counter() - start
    if rank == 0:
        rate = (args.steps - 1) * args.batch * world / elapsed
        print(f"torch ddp gloo: world {world}, batch {args.batch} per rank, "
              f"{rate:.0f} samples/s ({elapsed / (args.steps - 1) * 1e3:.1f} ms/step)")
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--in", dest="inp", type=int, default=784)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--hidden", default="1024,1024")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
