"""A worker started by torchrun or loom-run: init_process_group("loom") from the environment
(env://), one all_reduce, a new_group and a barrier."""

import torch
import torch.distributed as dist

import loom_torch  # noqa: F401

dist.init_process_group("loom")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), world * (world + 1) / 2)), t
sub = dist.new_group([0, world - 1])
if rank in (0, world - 1):
    s = torch.ones(3)
    dist.all_reduce(s, group=sub)
    assert torch.equal(s, torch.full((3,), 2.0)), s
dist.barrier()
print(f"OK rank {rank} of {world}: {loom_torch.transport_summary()}", flush=True)
dist.destroy_process_group()
