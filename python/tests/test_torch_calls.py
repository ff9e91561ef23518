"""The calls newer torch asks of a CPU backend, on whichever torch runs the suite: PREMUL_SUM
(both), batch_isend_irecv (both), dist.monitored_barrier (2.15), the *_tensor_coalesced calls and _coalescing_manager
(torch 2.x), split_group (torch 2.9), and the errors that name an unsupported call and the
torch version."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

TORCH = ranks.TORCH
FLOATS = [torch.float32, torch.float64, torch.bfloat16]


def _premul(factor):
    import torch.distributed as dist
    # ReduceOp.PREMUL_SUM is callable in newer torch (2.13 and 2.15, not 2.11); every 2.x and
    # 1.13 have the private maker.
    if callable(dist.ReduceOp.PREMUL_SUM):
        return dist.ReduceOp.PREMUL_SUM(factor)
    return dist._make_nccl_premul_sum(factor)


def _close(got, want, what):
    torch.testing.assert_close(got, want.to(got.dtype), msg=lambda m: f"{what}: {m}")


def _premul_sum(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    f = 0.25
    for dtype in FLOATS:
        x = (torch.arange(6) + rank + 1).to(dtype)
        want = sum((torch.arange(6) + r + 1).double() for r in range(world)) * f
        t = x.clone()
        dist.all_reduce(t, op=_premul(f))
        _close(t, want, f"all_reduce PREMUL_SUM {dtype}")
        # A non-contiguous tensor: staged, scaled, written back.
        t = torch.stack([x.clone(), torch.zeros(6, dtype=dtype)], 1)[:, 0]
        dist.all_reduce(t, op=_premul(f))
        _close(t, want, f"all_reduce PREMUL_SUM non-contiguous {dtype}")
        # reduce: the root gets the scaled sum; the others keep their tensor.
        t = x.clone()
        dist.reduce(t, 0, op=_premul(f))
        _close(t, want if rank == 0 else x.double(), f"reduce PREMUL_SUM {dtype}")
        # reduce_scatter_tensor: the input stays as it was.
        inp = torch.cat([x + j for j in range(world)])
        before = inp.clone()
        out = torch.zeros(6, dtype=dtype)
        dist.reduce_scatter_tensor(out, inp, op=_premul(f))
        _close(out, want + rank * world * f, f"reduce_scatter_tensor PREMUL_SUM {dtype}")
        assert torch.equal(inp, before), "PREMUL_SUM changed the caller's input"
    # A tensor factor (what FSDP passes on some paths) works as a double does.
    t = torch.ones(3)
    if TORCH >= (2, 0):
        dist.all_reduce(t, op=_premul(torch.tensor(0.5)))
        _close(t, torch.full((3,), 0.5 * world), "all_reduce PREMUL_SUM tensor factor")
    with pytest.raises(RuntimeError, match="PREMUL_SUM needs a floating-point dtype"):
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=_premul(f))
    dist.barrier()
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_premul_sum(world):
    ranks.spawn(_premul_sum, world, timeout=60)


def _batch_p2p(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    if TORCH >= (2, 7):  # batch_isend_irecv then runs the batch as one coalescing block
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert backend.supports_coalescing
    right, left = (rank + 1) % world, (rank - 1) % world
    for _ in range(3):
        got = torch.zeros(5)
        ops = [dist.P2POp(dist.isend, torch.full((5,), float(rank)), right),
               dist.P2POp(dist.irecv, got, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        assert torch.equal(got, torch.full((5,), float(left))), got
    if TORCH >= (2, 15):  # its dist.monitored_barrier takes any group with a CPU backend
        from datetime import timedelta
        dist.monitored_barrier(timeout=timedelta(seconds=10), wait_all_ranks=True)
    return True


def test_batch_isend_irecv_ring_and_monitored_barrier():
    ranks.spawn(_batch_p2p, 3, timeout=60)


def _coalesced(rank, world, tmp):
    import loom_torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    gloo = ranks.init_loom_and_gloo(rank, world, tmp)

    def seq():  # Loom operations so far (the recorder keeps 2000, more than this test runs)
        return len(loom_torch.flight_record()["entries"])

    for device in (None, torch.device("cpu")):
        # all_reduce: one allreduce_coalesced, one Loom operation.
        ts = [torch.full((k + 1,), float(rank + k)) for k in range(4)]
        refs = [t.clone() for t in ts]
        first = seq()
        with _coalescing_manager(device=device):
            for t in ts:
                dist.all_reduce(t)
        assert seq() == first + 1, "all_reduce under _coalescing_manager was not one operation"
        for t in refs:
            dist.all_reduce(t, group=gloo)
        for t, r in zip(ts, refs):
            assert torch.equal(t, r), (t, r)

        # all_gather_into_tensor of two dtypes: one Loom operation per dtype.
        ins = [torch.full((3,), float(rank)), torch.full((2, 2), rank, dtype=torch.int64),
               torch.arange(5, dtype=torch.float32) + rank]
        outs = [torch.zeros(world * 3), torch.zeros(world * 2, 2, dtype=torch.int64),
                torch.zeros(world, 5)]
        first = seq()
        with _coalescing_manager(device=device, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        cm.wait()
        assert seq() == first + 2, "all_gather_into_tensor: not one operation per dtype"
        for o, i in zip(outs, ins):
            parts = [torch.zeros_like(i) for _ in range(world)]
            dist.all_gather(parts, i, group=gloo)
            want = torch.stack(parts).reshape(o.shape)
            assert torch.equal(o, want), (o, want)

        # reduce_scatter_tensor with AVG (FSDP2's gradient reduction), one operation.
        ins = [torch.arange(world * 4, dtype=torch.float32) * (rank + 1),
               torch.ones(world * 2, 3, dtype=torch.float32) * rank]
        outs = [torch.zeros(4), torch.zeros(2, 3)]
        first = seq()
        with _coalescing_manager(device=device):
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=dist.ReduceOp.AVG)
        assert seq() == first + 1, "reduce_scatter_tensor under _coalescing_manager: not one op"
        mean = (world + 1) / 2
        _close(outs[0], torch.arange(rank * 4, rank * 4 + 4, dtype=torch.float64) * mean, "rs 0")
        _close(outs[1], torch.full((2, 3), (world - 1) / 2), "rs 1")
    dist.barrier()
    return True


@pytest.mark.skipif(TORCH < (2, 1), reason=f"torch {torch.__version__}: no coalesced calls before 2.1")
def test_coalescing_manager_is_one_loom_operation():
    ranks.spawn(_coalesced, 3, timeout=60)


def _split(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    assert backend.supports_splitting
    if TORCH < (2, 15):
        # torch 2.9 to 2.14: dist.split_group refuses a default group that is not bound to an
        # accelerator (init_process_group's device_id), which a CPU-only group cannot be, with
        # any backend. Its C++ half, ProcessGroup.split_group, which splits each of the group's
        # backends (loom's for "cpu" beside nccl's for "cuda" on a GPU machine), runs here.
        from datetime import timedelta
        mine = [1] if rank == 1 else [0, 2]
        name = "split-" + "-".join(map(str, mine))  # one per child group, as split_group's
        sub = dist.distributed_c10d._get_default_group().split_group(
            mine, timeout=timedelta(seconds=30), opts=None, group_name=name, group_desc=name)
        assert sub is not None and sub.size() == len(mine) and sub.rank() == mine.index(rank)
        assert sub._get_backend(torch.device("cpu")).name() == "loom"
        t = torch.full((4,), float(rank))
        sub.allreduce([t]).wait()
        assert torch.equal(t, torch.full((4,), float(sum(mine)))), t
        dist.barrier()
        return True
    sub = dist.split_group(split_ranks=[[0, 2], [1]])
    if rank == 1:
        assert sub is not None and sub.size() == 1
    else:
        assert dist.get_backend(sub) == "loom" and sub.size() == 2
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=sub)
        assert torch.equal(t, torch.full((4,), 2.0)), t
    dist.barrier()
    return True


@pytest.mark.skipif(TORCH < (2, 9), reason=f"torch {torch.__version__}: Backend::split from 2.9")
def test_split_group():
    ranks.spawn(_split, 3, timeout=60)


def _unsupported(rank, world, tmp):
    import torch.distributed as dist

    ranks.init_loom_and_gloo(rank, world, tmp)
    group = dist.distributed_c10d._get_default_group()
    with pytest.raises(RuntimeError) as info:
        group.allgather_coalesced([[torch.zeros(2) for _ in range(world)]], [torch.ones(2)])
    message = str(info.value)
    assert "allgather_coalesced" in message and "torch " in message, message
    built = __import__("loom_torch").TORCH_BUILT_WITH
    assert built in message, message
    dist.barrier()
    return True


def test_unsupported_call_names_itself_and_the_torch_version():
    ranks.spawn(_unsupported, 2, timeout=60)
