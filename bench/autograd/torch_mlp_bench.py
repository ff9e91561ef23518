#!/usr/bin/python3
"""PyTorch's number for bench/autograd: training steps/s of the same MLP at batch 64, on
--threads threads (torch.set_num_threads).

Run with OpenBLAS (Debian's torch defaults to the reference BLAS, see ANCHORS.md):
  OPENBLAS_NUM_THREADS=1 LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread \
      /usr/bin/python3 bench/autograd/torch_mlp_bench.py --threads 1
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--opt", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    if args.opt == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(64, 784)
    y = torch.randint(0, 10, (64,))

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    a = torch.randn(64, 1024)
    b = torch.randn(1024, 1024)
    t0 = time.perf_counter()
    for _ in range(50):
        a @ b
    gflops = 2 * 64 * 1024 * 1024 * 50 / (time.perf_counter() - t0) / 1e9
    # Wall-clock rate, and CPU seconds per step of the whole process (all threads), as
    # mlp_bench.cc reports them.
    best_wall, best_cpu_ms = 0.0, float("inf")
    for _ in range(args.repeats):
        n = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < args.seconds:
            step()
            n += 1
        best_wall = max(best_wall, n / (time.perf_counter() - t0))
        best_cpu_ms = min(best_cpu_ms, (time.process_time() - c0) / n * 1e3)
    print(f"torch {torch.__version__} opt={args.opt} threads={torch.get_num_threads()} "
          f"matmul 64x1024x1024: {gflops:.1f} GFLOP/s (wall); best of {args.repeats}: "
          f"{best_wall:.1f} steps/s wall ({best_wall * 64:.0f} samples/s), "
          f"{best_cpu_ms:.2f} ms CPU/step")


if __name__ == "__main__":
    main()
