#!/usr/bin/python3
"""`loom-train --model gpt` on 2 ranks against PyTorch DDP (gloo, 2 ranks): the same per-step
losses from the same initial weights and data.

    /usr/bin/python3 examples/loom_train/gpt_parity.py --loom-train build/bin/loom-train \\
        --text docs/ddp.md

Builds the GPT of examples/loom_train/gpt.cc in PyTorch (the same module names), saves its
initial weights as safetensors (written by hand: torch 1.13 has no safetensors module), trains it
with DistributedDataParallel on 2 spawned ranks, then runs loom-train on 2 ranks (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set here, as loom-run would) with --init-weights and the
same flags. The data are the text's characters numbered as gpt.cc numbers them (sorted distinct
bytes), windows of context + 1 tokens at multiples of context in the first (1 - val_fraction)
of the text, drawn by torch's DistributedSampler (shuffle, seed 0, drop_last), which loom-train's
sampler reproduces. AdamW, no weight decay. Exits 1 unless every step's loss agrees within
--tolerance (relative).
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DistributedSampler
except ImportError as e:  # ctest reads exit code 77 as skipped
    print(f"skipped: gpt_parity needs PyTorch ({e}; Debian: python3-torch, scripts/setup.sh)")
    sys.exit(77)

WORLD = 2


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = Mlp(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, a):
        super().__init__()
        self.wte = nn.Embedding(vocab, a.width)
        self.wpe = nn.Embedding(a.context, a.width)
        self.h = nn.Sequential(*[Block(a.width, a.heads) for _ in range(a.layers)])
        self.ln_f = nn.LayerNorm(a.width)
        self.lm_head = nn.Linear(a.width, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return self.lm_head(self.ln_f(self.h(x)))


def tokenize(path):
    data = open(path, "rb").read()
    chars = sorted(set(data))
    index = {c: i for i, c in enumerate(chars)}
    return np.array([index[c] for c in data], dtype=np.int64), len(chars)


def save_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def torch_worker(rank, a, vocab, tokens, port, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(a.seed)
    model = Gpt(vocab, a)
    model.load_state_dict(torch.load(os.path.join(out, "init.pt")))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, weight_decay=0.0)
    t = a.context
    train_tokens = int(len(tokens) * (1 - a.val_fraction))
    rows = (train_tokens - 1) // t
    sampler = DistributedSampler(range(rows), num_replicas=WORLD, rank=rank, shuffle=True,
                                 seed=a.seed, drop_last=True)
    per_epoch = len(sampler) // a.batch
    tokens = torch.from_numpy(tokens)
    losses, epoch, indices = [], -1, []
    for step in range(a.steps):
        if step // per_epoch != epoch:
            epoch = step // per_epoch
            sampler.set_epoch(epoch)
            indices = list(sampler)
        pos = (step % per_epoch) * a.batch
        batch = indices[pos:pos + a.batch]
        x = torch.stack([tokens[r * t:r * t + t] for r in batch])
        y = torch.stack([tokens[r * t + 1:r * t + 1 + t] for r in batch])
        opt.zero_grad()
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        total = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    if rank == 0:
        with open(os.path.join(out, "torch_losses.csv"), "w") as f:
            f.write("step,loss\n")
            for i, l in enumerate(losses):
                f.write(f"{i + 1},{l:.9g}\n")
    dist.destroy_process_group()


def read_losses(path):
    with open(path) as f:
        lines = f.read().split("\n")[1:]
    return [float(line.split(",")[1]) for line in lines if line]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loom-train", required=True, help="the loom-train binary")
    p.add_argument("--text", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--port", type=int, default=0, help="base port (0: from the pid)")
    a = p.parse_args()
    port = a.port or 23000 + os.getpid() % 2000 * 2
    tokens, vocab = tokenize(a.text)
    with tempfile.TemporaryDirectory() as out:
        torch.manual_seed(a.seed)
        init = Gpt(vocab, a).state_dict()
        torch.save(init, os.path.join(out, "init.pt"))
        save_safetensors(os.path.join(out, "init.safetensors"), init)
        mp.spawn(torch_worker, args=(a, vocab, tokens, port, out), nprocs=WORLD, join=True)

        cmd = [a.loom_train, "--model", "gpt", "--text", a.text, "--layers", str(a.layers),
               "--heads", str(a.heads), "--width", str(a.width), "--context", str(a.context),
               "--batch", str(a.batch), "--steps", str(a.steps), "--lr", str(a.lr),
               "--optimizer", "adamw", "--seed", str(a.seed), "--val-fraction",
               str(a.val_fraction), "--sample-chars", "0", "--init-weights",
               os.path.join(out, "init.safetensors"), "--log", os.path.join(out, "loom.csv")]
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port + 1), LOOM_AUTOGRAD_THREADS="1")
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
        codes = [proc.wait(timeout=300) for proc in procs]
        if any(codes):
            sys.exit(f"gpt_parity: loom-train exited with {codes}: {' '.join(cmd)}")
        want = read_losses(os.path.join(out, "torch_losses.csv"))
        got = read_losses(os.path.join(out, "loom.csv"))
    if len(got) != len(want):
        sys.exit(f"gpt_parity: loom-train logged {len(got)} steps, PyTorch {len(want)}")
    worst = 0.0
    for step, (g, w) in enumerate(zip(got, want), 1):
        rel = abs(g - w) / abs(w)
        worst = max(worst, rel)
        print(f"step {step:3d} loom {g:.7f} torch {w:.7f} rel {rel:.2e}")
    print(f"gpt_parity: {len(got)} steps, max relative difference {worst:.2e} "
          f"(tolerance {a.tolerance:g}), loss {want[0]:.4f} -> {want[-1]:.4f}")
    sys.exit(0 if worst <= a.tolerance else 1)


if __name__ == "__main__":
    main()
