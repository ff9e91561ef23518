"""loom_torch.set_reproducible: SUM and AVG over float32 and float64 tensors give the correctly
rounded exact sum of every rank's values (checked bit for bit against Python's exact fractions),
the same bits when the inputs are assigned to the ranks in another order and whatever the chunk
of the call; torch DDP over such a group gives bitwise-equal parameters whatever its bucket
size; PROD over a floating tensor is refused with the reason. docs/reproducible.md."""

import math
import random
import struct
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (scripts/setup.sh)")

import ranks  # noqa: E402

N = 3001  # elements per rank: odd, past the one-pass path (16 KiB of accumulators)
SEED = 20261128


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _from_f32_bits(b):
    return struct.unpack("<f", struct.pack("<I", b))[0]


def _round_f32(q):
    """The float32 nearest to the rational q, ties to even (overflow to infinity)."""
    if q == 0:
        return 0.0
    try:
        c = _f32(float(q))  # float(q) rounds once, packing to float32 twice: off by 1 ulp at most
    except OverflowError:
        return math.copysign(math.inf, q)
    best = None
    b = _f32_bits(c)
    for cand_bits in (b - 1, b, b + 1):
        if cand_bits < 0 or cand_bits >= 1 << 32:
            continue
        v = _from_f32_bits(cand_bits)
        if math.isnan(v):
            continue
        if math.isinf(v):
            # the float32 overflow threshold: max finite + half an ulp
            top = Fraction(_from_f32_bits(0x7F7FFFFF)) + Fraction(2) ** 103
            if abs(q) >= top and (v > 0) == (q > 0):
                return v
            continue
        d = abs(Fraction(v) - q)
        even = _f32_bits(v) % 2 == 0
        if best is None or d < best[0] or (d == best[0] and even):
            best = (d, v)
    return best[1]


def _inputs(world, dtype, n=N):
    """Every rank's values, chosen to defeat naive summation: mixed magnitudes, cancellation,
    exact ties, subnormals (the same list on every rank: a seeded generator)."""
    rng = random.Random(SEED + world)
    f32 = dtype == torch.float32
    tiny = 2.0 ** -149 if f32 else 2.0 ** -1074
    big = 2.0 ** 100 if f32 else 2.0 ** 900
    rows = [[0.0] * n for _ in range(world)]
    for i in range(n):
        kind = i % 6
        for r in range(world):
            if kind == 0:  # mixed magnitudes
                v = rng.choice([1.0, -1.0]) * rng.random() * 2.0 ** rng.randint(-60, 60)
            elif kind == 1:  # cancellation: big values cancel, small ones remain
                v = (big if r % 2 == 0 else -big) if r < world - world % 2 else rng.random()
            elif kind == 2:  # ties: 1 + half an ulp, then something tiny that breaks the tie
                ulp = 2.0 ** -23 if f32 else 2.0 ** -52
                v = [1.0, ulp / 2, ulp * 2.0 ** -40][r] if r < 3 else 0.0
            elif kind == 3:  # subnormals
                v = rng.randint(-1000, 1000) * tiny
            elif kind == 4:  # ordinary gradients
                v = rng.gauss(0.0, 1e-3)
            else:  # near the top of the range
                v = rng.choice([1.0, -1.0]) * big * rng.random()
            rows[r][i] = _f32(v) if f32 else v
    return rows


def _expected(rows, dtype, avg):
    world = len(rows)
    out = []
    for i in range(len(rows[0])):
        q = sum(Fraction(row[i]) for row in rows)
        if avg:
            q /= world
        out.append(_round_f32(q) if dtype == torch.float32 else float(q))
    return out


def _reproducible_allreduce(rank, world, tmp):
    import torch.distributed as dist

    import loom_torch

    loom_torch.set_reproducible(True)
    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world)
    assert loom_torch.is_reproducible()
    perm = list(range(world))[::-1]  # another assignment of the same inputs to the ranks
    for dtype in (torch.float32, torch.float64):
        rows = _inputs(world, dtype)
        for op, avg in ((dist.ReduceOp.SUM, False), (dist.ReduceOp.AVG, True)):
            want = torch.tensor(_expected(rows, dtype, avg), dtype=dtype)
            got = []
            for assign in (list(range(world)), perm):
                t = torch.tensor(rows[assign[rank]], dtype=dtype)
                dist.all_reduce(t, op=op)
                got.append(t)
            for t in got:
                bad = (t.view(torch.int32 if dtype == torch.float32 else torch.int64) !=
                       want.view(torch.int32 if dtype == torch.float32 else torch.int64))
                assert not bool(bad.any()), (
                    f"{dtype} {op}: {int(bad.sum())} elements differ from the correctly rounded "
                    f"sum, first at {int(bad.nonzero()[0])}: got {t[bad][0].item()!r}, "
                    f"want {want[bad][0].item()!r}")
    # special values: NaN, +inf with -inf
    t = torch.tensor([math.inf if rank == 0 else -math.inf, math.nan if rank == 1 else 1.0,
                      math.inf], dtype=torch.float32)
    dist.all_reduce(t)
    assert math.isnan(t[0]) and math.isnan(t[1]) and t[2] == math.inf, t
    with pytest.raises(RuntimeError, match="(?i)prod"):
        dist.all_reduce(torch.ones(4), op=dist.ReduceOp.PRODUCT)
    # the group is still usable after the refusal
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * 4
    dist.destroy_process_group()
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_reproducible_allreduce_is_correctly_rounded(world):
    assert all(ranks.spawn(_reproducible_allreduce, world, timeout=120).values())


def _ddp_params(rank, world, tmp, bucket_mb, reproducible):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import loom_torch

    loom_torch.set_reproducible(reproducible)
    dist.init_process_group("loom", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(6):
        x = torch.randn(32, 64, generator=g) * torch.logspace(-3, 3, 64)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dist.destroy_process_group()
    return flat.view(torch.int32).tolist() if rank == 0 else None


def test_ddp_bitwise_equal_across_bucket_sizes():
    """Two bucket sizes cut the gradients into different all-reduces (different chunking and
    algorithms); in reproducible mode the parameters after 6 steps are bitwise equal."""
    a = ranks.spawn(_ddp_params, 3, 25.0, True, timeout=120)[0]
    b = ranks.spawn(_ddp_params, 3, 0.01, True, timeout=120)[0]
    assert a == b, f"{sum(x != y for x, y in zip(a, b))} of {len(a)} parameter words differ"


def _reproducible_flags(rank, world, tmp):
    import os

    import torch.distributed as dist

    import loom_torch

    got = []
    # (set_reproducible, LOOM_REPRODUCIBLE): the option wins; unset, the environment decides.
    for i, (option, env) in enumerate(((False, None), (False, "1"), (True, "0"), (False, "0"))):
        if env is None:
            os.environ.pop("LOOM_REPRODUCIBLE", None)
        else:
            os.environ["LOOM_REPRODUCIBLE"] = env
        loom_torch.set_reproducible(option)
        dist.init_process_group("loom", init_method=f"file://{tmp}/store{i}", rank=rank,
                                world_size=world)
        got.append(loom_torch.is_reproducible())
        dist.destroy_process_group()
    return got


def test_is_reproducible_reports_the_groups_decision():
    """is_reproducible() is what the Loom group's Context decided when it was created:
    set_reproducible(True), else LOOM_REPRODUCIBLE (one rank, four groups in turn)."""
    assert ranks.spawn(_reproducible_flags, 1, timeout=60)[0] == [False, True, True, False]
