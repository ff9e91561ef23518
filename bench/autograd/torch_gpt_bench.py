#!/usr/bin/python3
"""PyTorch's number for gpt_bench.cc: training steps/s of the same small GPT (vocabulary 256,
context 128, 4 layers, 4 heads, width 128, batch 8, AdamW) on --threads threads.

  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \\
      /usr/bin/python3 bench/autograd/torch_gpt_bench.py --threads 1
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, LAYERS, HEADS, WIDTH, BATCH = 256, 128, 4, 4, 128, 8


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        d = c // HEADS
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, HEADS, d).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH)
        self.fc, self.proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x)).view(-1, VOCAB)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, VOCAB, (BATCH, CONTEXT))
    y = torch.randint(0, VOCAB, (BATCH * CONTEXT,))

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    best_wall, best_cpu_ms = 0.0, float("inf")
    for _ in range(args.repeats):
        n = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < args.seconds:
            step()
            n += 1
        best_wall = max(best_wall, n / (time.perf_counter() - t0))
        best_cpu_ms = min(best_cpu_ms, (time.process_time() - c0) / n * 1e3)
    print(f"torch {torch.__version__} gpt threads={torch.get_num_threads()} best of {args.repeats}: "
          f"{best_wall:.2f} steps/s wall ({best_wall * BATCH * CONTEXT:.0f} tokens/s), "
          f"{best_cpu_ms:.1f} ms CPU/step")


if __name__ == "__main__":
    main()
