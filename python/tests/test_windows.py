"""loom_torch.empty: tensors in Loom windows (zero-copy shared memory). Every collective that
reads peers' windows gives the same result as on ordinary tensors, for every dtype, with the
peers' windows really mapped in each rank; shapes and dtypes come out as asked; a rank that
passes a window while its peer passes an ordinary tensor fails on both ranks with both paths
named."""

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
N = 30001  # odd: no segment boundary falls on a round number


def _foreign_windows(own):
    """Mappings of other processes' windows in this one (lines of /proc/self/maps)."""
    starts = {t.data_ptr() - t.storage_offset() * t.element_size() for t in own}
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if "/memfd:loom-window-" in line and int(line.split("-")[0], 16) not in starts:
                n += 1
    return n


def _values(dtype, rank, n):
    i = torch.arange(n)
    if dtype == torch.bool:
        return (i + rank) % 2 == 0
    return ((i + rank) % 3 + 1).to(dtype)


def _window_collectives(rank, world, tmp):
    import torch.distributed as dist

    import loom_torch

    os.environ["LOOM_SHM_WINDOW_MIN_BYTES"] = "1"  # every size takes the window path
    gloo = ranks.init_loom_and_gloo(rank, world, tmp)
    assert loom_torch.transport_summary().startswith("shm"), loom_torch.transport_summary()
    own = []
    for dtype in DTYPES:
        # all_reduce in place, against gloo on an ordinary tensor (gloo has no bool sum: max)
        op = dist.ReduceOp.MAX if dtype == torch.bool else dist.ReduceOp.SUM
        t = loom_torch.empty(N, dtype=dtype)
        own.append(t)
        t.copy_(_values(dtype, rank, N))
        want = _values(dtype, rank, N)
        if dtype in (torch.float16, torch.bfloat16, torch.bool):  # gloo lacks them: locally
            if dtype == torch.bool:
                want = torch.stack([_values(dtype, r, N) for r in range(world)]).any(0)
            else:
                want = sum(_values(torch.float32, r, N) for r in range(world)).to(dtype)
        else:
            dist.all_reduce(want, op=op, group=gloo)
        dist.all_reduce(t, op=op)
        assert torch.equal(t, want), (dtype, t[:8], want[:8])

        # broadcast from the last rank
        b = loom_torch.empty((N,), dtype=dtype)
        own.append(b)
        b.copy_(_values(dtype, world - 1 if rank == world - 1 else 0, N))
        dist.broadcast(b, src=world - 1)
        assert torch.equal(b, _values(dtype, world - 1, N)), dtype

        # all-gather into one tensor, then reduce-scatter of it
        inp = loom_torch.empty(N, dtype=dtype)
        out = loom_torch.empty(world * N, dtype=dtype)
        own += [inp, out]
        inp.copy_(_values(dtype, rank, N))
        dist._all_gather_base(out, inp)
        assert torch.equal(out, torch.cat([_values(dtype, r, N) for r in range(world)])), dtype
        if dtype != torch.bool:
            rs = torch.zeros(N, dtype=dtype)
            dist._reduce_scatter_base(rs, out)
            # every rank passes the same gathered tensor: slice r summed over the ranks
            assert torch.equal(rs, (world * _values(dtype, rank, N).to(torch.float64)).to(dtype)), dtype
    dist.barrier()
    foreign = _foreign_windows(own)
    assert foreign >= world - 1, f"rank {rank} maps {foreign} peer windows"

    # Shapes, dtypes, views
    m = loom_torch.empty((3, 5), dtype=torch.bfloat16)
    assert m.shape == (3, 5) and m.dtype == torch.bfloat16 and m.is_contiguous()
    assert loom_torch.empty(2, 3).shape == (2, 3)
    assert loom_torch.empty(0).numel() == 0
    return foreign


def test_window_tensors_match_ordinary_ones_and_peers_map_them():
    ranks.spawn(_window_collectives, 2, timeout=120)


def _mixed(rank, world, tmp):
    import torch.distributed as dist

    import loom_torch

    ranks.init_loom_and_gloo(rank, world, tmp)
    n = 1 << 20  # 4 MiB: above every default size of the window path
    t = loom_torch.empty(n) if rank == 0 else torch.zeros(n)
    with pytest.raises(loom_torch.LoomError) as error:
        dist.all_reduce(t)
    text = str(error.value)
    assert "zero-copy window" in text and "staged" in text, text


def test_a_window_against_an_ordinary_tensor_fails_on_both_ranks():
    ranks.spawn(_mixed, 2, timeout=60)


def test_bad_shapes_and_dtypes_are_torchs_errors():
    import loom_torch

    # torch.empty(-1) raises; a window of a negative dimension came back as a 0-element tensor.
    with pytest.raises(RuntimeError, match="negative dimension -1"):
        loom_torch.empty(-1)
    with pytest.raises(RuntimeError, match="negative dimension -1"):
        loom_torch.empty(-1, 4)
    assert loom_torch.empty(0, 3).shape == (0, 3)
