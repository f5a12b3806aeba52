"""Collectives for one rank against a communicator (naive.py), and which communicator a rank
uses while it runs a graph: the IR's collective ops call `current()`.

    with using(comm):                 # the simulator's in-process comm, or the rank runner's
        y = interpret(rank_graph, ...)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ...errors import UsageError
from .naive import Comm, all_to_all, moe_combine, moe_dispatch, token_slice

_CURRENT: ContextVar[Comm | None] = ContextVar("k3c_comm", default=None)


def current(op: str = "a collective") -> Comm:
    """The communicator of the running rank; a UsageError when a collective runs outside one."""
    comm = _CURRENT.get()
    if comm is None:
        raise UsageError(f"{op} is a collective: it needs the other ranks. Run a partitioned graph with "
                         f"k3c.distributed.simulate (all ranks in this process) or in a rank process "
                         f"(k3c.distributed.launch under torchrun)")
    return comm


@contextmanager
def using(comm: Comm) -> Iterator[Comm]:
    token = _CURRENT.set(comm)
    try:
        yield comm
    finally:
        _CURRENT.reset(token)


__all__ = ["Comm", "current", "using", "all_to_all", "moe_dispatch", "moe_combine", "token_slice"]
