"""Loom as a torch.distributed backend.

``import loom_torch`` registers the backend ``"loom"``; then
``torch.distributed.init_process_group("loom", ...)`` runs every collective on CPU tensors
through Loom (shared memory between ranks on one host, TCP between hosts). See docs/torch.md.
"""

import inspect
import json
import math
from datetime import timedelta

import torch
import torch.distributed as dist


def _check_torch_version(built_with):
    built = tuple(int(x) for x in built_with.split(".")[:2])
    running = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if built != running:
        raise ImportError(f"loom_torch was built against torch {built_with} but runs under "
                          f"torch {torch.__version__}: rebuild it against this torch "
                          "(pip install --no-build-isolation ./python, or cmake "
                          "-DLOOM_PYTHON=<this python>; docs/torch.md)")


# Checked before the module loads: a module compiled against another torch can abort the
# interpreter while it loads (torch's pybind11 types differ between versions).
try:
    from ._built_with import LOOM_VERSION
    from ._built_with import TORCH_VERSION as _BUILT_WITH
except ImportError:  # a build tree from before the file existed: the module's own check below
    LOOM_VERSION, _BUILT_WITH = "unknown", None
if _BUILT_WITH is not None:
    _check_torch_version(_BUILT_WITH)

try:
    from . import _C
except ImportError as e:  # most often: built against another torch than this one
    raise ImportError(
        f"loom_torch: cannot load its C++ module under torch {torch.__version__} ({e}); "
        "rebuild it against this torch (cmake -DLOOM_PYTHON=<this python>, docs/torch.md)"
    ) from e
from ._C import LoomError

__all__ = ["LoomError", "BACKEND", "transport_summary", "flight_record", "empty",
           "set_reproducible", "is_reproducible"]

BACKEND = "loom"
# The torch the C++ module was compiled against ("1.13.0", "2.15.0").
TORCH_BUILT_WITH = _C.TORCH_VERSION
_check_torch_version(TORCH_BUILT_WITH)


def _store_address(store):
    """The host and port of the TCPStore under torch's PrefixStores, or ("", 0) (FileStore,
    HashStore)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return store.host, store.port
    return "", 0


_reproducible_default = False


def set_reproducible(enabled=True):
    """Loom groups created after this call (dist.init_process_group, dist.new_group) reduce SUM
    and AVG over float32, float64, float16 and bfloat16 tensors in reproducible mode: each
    element is the correctly rounded sum of every rank's values, bitwise the same whatever the
    algorithm, transport, bucket size or rank order (docs/reproducible.md); PROD over floating
    tensors is then refused. Every rank must make the same choice. LOOM_REPRODUCIBLE=1 in the
    environment does the same for every group."""
    global _reproducible_default
    if not isinstance(enabled, bool):
        raise TypeError(f"loom_torch.set_reproducible: expected a bool, got {enabled!r}")
    _reproducible_default = enabled


def is_reproducible(group=None):
    """Whether a loom group (default: the default group) reduces in reproducible mode."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return _C._reproducible(group)


def _create(store, rank, world_size, timeout, name="", parent_ranks=()):
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if timeout.total_seconds() <= 0:
        raise ValueError(f"loom: the process group's timeout must be positive, got {timeout!r}")
    # A positive timeout under a millisecond is one millisecond, the unit Loom counts in.
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    host, port = _store_address(store)
    return _C._create_process_group(store, rank, world_size, timeout_ms, host,
                                    _reproducible_default, port, name, list(parent_ranks))


def _create_extended(opts, _backend_options=None):
    """torch's extended creator API (torch 1.13 and 2.x): a subgroup is named in Loom's errors
    and flight records after torch's group name, with the default group's ranks it holds
    ('rank 0 of torch:1 (parent ranks 0,2)'), so that a hang across groups names both
    (docs/diagnostics.md). The default group keeps no name. (torch sets a group's group_desc
    only after its backend exists, so Loom cannot use it.)"""
    ranks = list(opts.global_ranks_in_group or [])
    name = f"torch:{opts.group_id}" if ranks else ""
    return _create(opts.store, opts.group_rank, opts.group_size, opts.timeout, name, ranks)


def transport_summary(group=None):
    """What carries a loom group's data ("shm (all 2 ranks on this host)", "tcp", ...)."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return _C._transport_summary(group)


def flight_record(group=None):
    """This rank's flight record of a loom group (default: the default group), as a dict: the
    last operations (LOOM_FLIGHT_RECORDER_ENTRIES, default 2000) with their sequence numbers,
    sizes, states and times (issue_us, start_us, end_us; start and end exact where "precise").
    The record is also published in the group's store for the failure analysis. Its format is
    in docs/diagnostics.md. LoomError when the recorder is off (LOOM_FLIGHT_RECORDER_ENTRIES=0).
    """
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return json.loads(_C._flight_record(group))


def empty(*size, dtype=torch.float32):
    """An uninitialised (zeroed) CPU tensor whose memory is a Loom window: when every rank of
    a loom group on one host passes such tensors to a large all_reduce, reduce_scatter,
    broadcast or all_gather, the peers read (and reduce from) each other's memory directly,
    one copy per byte instead of two (docs/shm.md, "Zero-copy windows"). Every rank must pass
    window tensors to a collective, or none: a rank that does not fails the collective on
    every rank with both paths named. Views of the tensor stay window memory; copies do not.

    loom_torch.empty(1024, 1024) / loom_torch.empty((64, 784), dtype=torch.bfloat16)
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    # torch's own checks and messages (a negative dimension, a bad dtype), with no memory.
    torch.empty(size, dtype=dtype, device="meta")
    numel = math.prod(size)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = _C._window_tensor(max(1, numel * itemsize))
    return raw[: numel * itemsize].view(dtype).view(size)


def _register():
    # torch 2.x: "loom" is the backend of a group's CPU tensors; register_backend takes the
    # devices from 2.1 on (without them, torch warns and assumes CPU plus the accelerator).
    params = inspect.signature(dist.Backend.register_backend).parameters
    kwargs = {"devices": ["cpu"]} if "devices" in params else {}
    dist.Backend.register_backend(BACKEND, _create_extended, extended_api=True, **kwargs)


if "LOOM" not in dist.Backend._plugins:
    _register()
