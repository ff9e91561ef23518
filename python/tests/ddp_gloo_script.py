"""A plain torch DDP training script on gloo, as found in tutorials: torchrun starts it, it
reads everything from the environment. test_torchrun.py runs it as it is and with the one
change docs/torch.md gives for loom (import loom_torch, backend "loom"), and compares."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(10):
        x = torch.randn(16, 20, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.9f}", flush=True)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print(f"rank {rank} params {params.double().sum().item():.9f} "
          f"{params.double().abs().sum().item():.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
