"""Loom as a torch.distributed backend.

``import loom_torch`` registers the backend ``"loom"``; then
``torch.distributed.init_process_group("loom", ...)`` runs every collective on CPU tensors
through Loom (shared memory between ranks on one host, TCP between hosts). See docs/torch.md.
"""

from datetime import timedelta

import torch.distributed as dist

from . import _C
from ._C import LoomError

__all__ = ["LoomError", "BACKEND", "transport_summary"]

BACKEND = "loom"


def _store_host(store):
    """The host of the TCPStore under torch's PrefixStores, or "" (FileStore, HashStore)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        return store.host
    return ""


def _create(store, rank, world_size, timeout):
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    return _C._create_process_group(store, rank, world_size, timeout_ms, _store_host(store))


def transport_summary(group=None):
    """What carries a loom group's data ("shm (all 2 ranks on this host)", "tcp", ...)."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    return _C._transport_summary(group)


if "LOOM" not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)
