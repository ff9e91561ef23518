"""torch 2.x users of the backend: FSDP2 (fully_shard) on a small transformer, the functional
collectives and DTensor redistributions, each over "loom" and over gloo on the same ranks with
the same inputs. Skipped on a torch that lacks them (1.13)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

TORCH = ranks.TORCH
STEPS = 20


def _model():
    import torch.nn as nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
                for _ in range(2))
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            h = self.embed(x)
            for block in self.blocks:
                h = block(h)
            return self.head(h).mean(1)

    torch.manual_seed(0)
    return Tiny().double()


def _fsdp2(rank, world, tmp):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    loom = dist.distributed_c10d._get_default_group()
    runs = {}
    for name, group in (("loom", loom), ("gloo", gloo)):
        mesh = DeviceMesh.from_group(group, "cpu")
        model = _model()
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(STEPS):
            x = torch.randn(4, 5, 8, generator=gen, dtype=torch.float64)
            y = torch.randn(4, 4, generator=gen, dtype=torch.float64)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        params = [p.full_tensor().detach().clone() for p in model.parameters()]
        runs[name] = (losses, params)
    (loom_losses, loom_params), (gloo_losses, gloo_params) = runs["loom"], runs["gloo"]
    for step, (a, b) in enumerate(zip(loom_losses, gloo_losses)):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (step, a, b)
    for a, b in zip(loom_params, gloo_params):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert loom_losses[-1] != loom_losses[0]  # it trained
    dist.barrier()
    return loom_losses[-1]


@pytest.mark.skipif(TORCH < (2, 6), reason=f"torch {torch.__version__}: "
                    "torch.distributed.fsdp.fully_shard from 2.6")
@pytest.mark.skipif(not hasattr(getattr(torch.cpu, "Stream", None), "record_event"),
                    reason=f"torch {torch.__version__}: fully_shard on CPU needs "
                    "torch.cpu.Stream.record_event (2.7 has it, 2.6 not), whatever the backend")
@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2_same_as_gloo(world):
    ranks.spawn(_fsdp2, world, timeout=240)


def _w(t):
    """A functional collective's result, waited for (some return a plain tensor)."""
    return t.wait() if hasattr(t, "wait") else t


def _funcol(rank, world, tmp):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    loom = dist.distributed_c10d._get_default_group()
    for dtype in (torch.float32, torch.float64, torch.int64):
        x = (torch.arange(world * 3) * (rank + 1)).to(dtype)
        got, want = {}, {}
        for name, group, out in (("loom", loom, got), ("gloo", gloo, want)):
            out["all_reduce"] = _w(funcol.all_reduce(x, "sum", group))
            out["all_reduce max"] = _w(funcol.all_reduce(x, "max", group))
            out["all_gather_tensor"] = _w(funcol.all_gather_tensor(x, 0, group))
            out["all_gather_tensor dim 1"] = _w(funcol.all_gather_tensor(x.view(world, 3), 1, group))
            out["reduce_scatter_tensor"] = _w(funcol.reduce_scatter_tensor(x, "sum", 0, group))
            out["all_reduce_coalesced"] = [
                _w(t) for t in funcol.all_reduce_coalesced([x, x + 1], "sum", group)]
            if hasattr(funcol, "broadcast"):  # torch 2.1's functional collectives have none
                out["broadcast"] = _w(funcol.broadcast(x, 1 % world, group))
        for key in want:
            a, b = got[key], want[key]
            if isinstance(b, list):
                for u, v in zip(a, b):
                    assert torch.equal(u, v), (key, u, v)
            else:
                assert torch.equal(a, b), (key, a, b)
    dist.barrier()
    return True


@pytest.mark.skipif(TORCH < (2, 1), reason=f"torch {torch.__version__}: no functional collectives")
def test_functional_collectives_same_as_gloo():
    ranks.spawn(_funcol, 3, timeout=120)


def _dtensor(rank, world, tmp):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    except ImportError:  # torch 2.4: DTensor is public from 2.5; 2.4's Partial is _Partial
        from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
        from torch.distributed._tensor.placement_types import _Partial as Partial

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    loom = dist.distributed_c10d._get_default_group()
    full = torch.arange(world * 4 * world * 2, dtype=torch.float64).view(world * 4, world * 2)
    results = {}
    for name, group in (("loom", loom), ("gloo", gloo)):
        mesh = DeviceMesh.from_group(group, "cpu")
        d = distribute_tensor(full, mesh, [Shard(0)])
        out = [d.redistribute(mesh, [Replicate()]).to_local(),          # all_gather
               d.redistribute(mesh, [Shard(1)]).to_local(),             # all_to_all
               d.redistribute(mesh, [Shard(1)]).full_tensor()]
        part = distribute_tensor(full, mesh, [Replicate()]).redistribute(mesh, [Replicate()])
        p = part.to_local() * (rank + 1)
        partial = DTensor.from_local(p, mesh, [Partial()])
        out.append(partial.redistribute(mesh, [Replicate()]).to_local())  # all_reduce
        out.append(partial.redistribute(mesh, [Shard(0)]).to_local())     # reduce_scatter
        results[name] = out
    for k, (a, b) in enumerate(zip(results["loom"], results["gloo"])):
        assert torch.equal(a, b), (k, a, b)
    assert torch.equal(results["loom"][0], full)
    assert torch.equal(results["loom"][3], full * (world * (world + 1) // 2))
    dist.barrier()
    return True


@pytest.mark.skipif(TORCH < (2, 4), reason=f"torch {torch.__version__}: DTensor with "
                    "DeviceMesh.from_group from 2.4 (public as torch.distributed.tensor from 2.5)")
def test_dtensor_redistribute_same_as_gloo():
    ranks.spawn(_dtensor, 3, timeout=120)
