"""torch DDP over backend "loom" gives the same losses and weights as over gloo, step by step:
no_sync accumulation, DistributedSampler.set_epoch, find_unused_parameters, the fp16
compression comm hook, a reduce-mean helper and distributed evaluation with all_gather. And a
peer SIGKILLed mid-training makes the survivor raise within seconds, naming the dead rank."""

import copy
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)
        self.extra = torch.nn.Linear(32, 4)  # used on some steps only

    def forward(self, x, use_extra):
        h = torch.relu(self.fc1(x))
        y = self.fc2(h)
        return y + self.extra(h) if use_extra else y


def _close(a, b, what):
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=lambda m: f"{what}: {m}")


def _ddp_vs_gloo(rank, world, tmp, hook):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    torch.manual_seed(0)
    base = Net()
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 4))
    groups = {"loom": dist.group.WORLD, "gloo": gloo}
    models, opts = {}, {}
    for name, group in groups.items():
        models[name] = DDP(copy.deepcopy(base), process_group=group, find_unused_parameters=True,
                           bucket_cap_mb=0.001)  # several buckets
        if hook:
            models[name].register_comm_hook(group, default_hooks.fp16_compress_hook)
        opts[name] = torch.optim.SGD(models[name].parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    losses = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(DataLoader(data, batch_size=4, sampler=sampler)):
            use_extra = (i // 2) % 2 == 0
            step = {}
            for name, model in models.items():
                loss = torch.nn.functional.mse_loss(model(x, use_extra), y)
                if i % 2 == 0:  # accumulate locally, synchronize on the next step
                    with model.no_sync():
                        loss.backward()
                else:
                    loss.backward()
                    opts[name].step()
                    opts[name].zero_grad()
                step[name] = loss.detach()
            _close(step["loom"], step["gloo"], f"loss epoch {epoch} step {i}")
            for (pn, p), (_, q) in zip(models["loom"].named_parameters(),
                                       models["gloo"].named_parameters()):
                _close(p, q, f"{pn} after epoch {epoch} step {i}")
            losses.append(step["loom"].item())

    # reduce-mean helper (all_reduce, then divide) and distributed evaluation (all_gather).
    evals = {}
    for name, group in groups.items():
        with torch.no_grad():
            x, _ = data[rank * 8:(rank + 1) * 8]
            pred = models[name](x, False)
            mean = pred.sum().reshape(1)
            dist.all_reduce(mean, group=group)
            mean /= world * pred.numel()
            gathered = [torch.zeros_like(pred) for _ in range(world)]
            dist.all_gather(gathered, pred, group=group)
            evals[name] = (mean, torch.cat(gathered))
    _close(evals["loom"][0], evals["gloo"][0], "reduce-mean")
    _close(evals["loom"][1], evals["gloo"][1], "gathered predictions")
    return losses


@pytest.mark.parametrize("hook", [False, True], ids=["allreduce", "fp16_hook"])
def test_ddp_matches_gloo_step_by_step(hook):
    losses = ranks.spawn(_ddp_vs_gloo, 2, hook, timeout=120)
    assert len(losses[0]) == 16  # 2 epochs x 8 steps of 4 samples per rank
    assert losses[0] != losses[1]  # the ranks saw different data


def _killed_peer(rank, world, tmp):
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import loom_torch  # noqa: F401

    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    for step in range(10000):
        if rank == 1 and step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            torch.nn.functional.mse_loss(model(x, True), y).backward()
            opt.step()
            opt.zero_grad()
        except RuntimeError as e:
            return str(e), time.monotonic() - start, step
    raise AssertionError("the survivor never noticed that rank 1 died")


def test_survivor_raises_within_seconds_naming_the_dead_rank():
    message, seconds, step = ranks.spawn(_killed_peer, 2, timeout=60, expect_dead=(1,))[0]
    print(f"rank 0 raised {seconds:.2f} s into step {step}: {message}")
    assert step == 20
    assert seconds < 10, message
    assert "rank 1" in message and "allreduce#" in message, message
