#!/usr/bin/env python3
"""PyTorch DDP (gloo) counterpart of loom-train for throughput comparisons: the same MLP
(Sequential(Linear, ReLU, ..., Linear)), SGD, --batch per rank, one thread per rank, synthetic
data; or, with --model gpt, the same character-level transformer as `loom-train --model gpt`
(gpt_parity.py's module, AdamW, windows of --context characters of --text drawn at random).
Spawns --nproc ranks itself and prints samples/s over the steps after the first.

  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
    python3 torch_ddp_train.py --nproc 2 --batch 64 --steps 100
"""
import argparse
import os
import sys
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


def gpt_setup(args, rank):
    """The GPT of loom-train --model gpt, its AdamW and a batch source over --text."""
    from gpt_parity import Gpt  # the same module names and shapes as examples/loom_train/gpt.cc
    data = b"".join(open(path, "rb").read() for path in args.text.split(","))
    chars = sorted(set(data))
    index = {c: i for i, c in enumerate(chars)}
    tokens = torch.tensor([index[c] for c in data], dtype=torch.int64)
    train = tokens[: int(len(tokens) * 0.9)]
    model = Gpt(len(chars), args)
    g = torch.Generator().manual_seed(rank)
    t = args.context

    def batch(step):
        starts = torch.randint(0, len(train) - t - 1, (args.batch,), generator=g)
        x = torch.stack([train[s:s + t] for s in starts])
        y = torch.stack([train[s + 1:s + 1 + t] for s in starts])
        return x, y

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, len(chars)), y.reshape(-1))

    return model, batch, loss_fn


def mlp_setup(args, rank):
    model = build(args)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.samples, args.inp, generator=g)
    y = torch.randint(0, args.classes, (args.samples,), generator=g)

    def batch(step):
        i = (step * args.batch) % (args.samples - args.batch)
        return x[i:i + args.batch], y[i:i + args.batch]

    return model, batch, nn.CrossEntropyLoss()


def worker(rank, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    world = args.nproc
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model, batch, loss_fn = (gpt_setup if args.model == "gpt" else mlp_setup)(args, rank)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    if args.model == "gpt":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = None
    for step in range(args.steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step == 0:
            start = time.perf_counter()
    elapsed = time.perf_counter() - start
    if rank == 0:
        rate = (args.steps - 1) * args.batch * world / elapsed
        print(f"torch ddp gloo ({args.model}): world {world}, batch {args.batch} per rank, "
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
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    p.add_argument("--text", default=",".join(
        f"/usr/share/games/fortunes/{n}" for n in
        "songs-poems literature people wisdom art work science humorists".split()),
        help="gpt: text files, comma-separated (loom-train's default)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    args = p.parse_args()
    if args.model == "gpt" and "--lr" not in sys.argv:
        args.lr = 3e-3
    mp.spawn(worker, args=(args,), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
