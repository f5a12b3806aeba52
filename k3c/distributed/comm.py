"""Communicators: the four primitives of k3c.kernels.collectives for one rank, and what they send.

- `TorchComm`: torch.distributed (gloo on CPU processes, NCCL on GPUs) over process groups made
  once for every group of the mesh. Every wait is bounded by the process group's timeout.
- `SimComm`: the simulator's: the ranks of one process, each in a thread for the length of a
  collective, hand their inputs to a shared exchange and compute the result from all of them
  (the sum in group order, the concatenation, the rows addressed to them). A rank that never
  arrives is a TimeoutError, one that fails makes the others fail too.

Both count the bytes each rank sends, per primitive, as passes/cost.py's `sent_bytes` defines
them, from the tensors actually handed over; and both send and receive point-to-point (a
pipeline stage's handover to the next: "send", the tensor's bytes once).
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from collections import Counter
from datetime import timedelta

import torch

from ..passes.cost import COUNT_BYTES, sent_bytes


class _Counted:
    rank: int

    def __init__(self):
        self.sent: Counter[str] = Counter()  # primitive -> bytes this rank sent
        self.calls: Counter[str] = Counter()

    def _count(self, kind: str, nbytes: float, members: int) -> None:
        self.sent[kind] += sent_bytes(kind, nbytes, members)
        self.calls[kind] += 1

    def _count_p2p(self, x: torch.Tensor) -> None:
        self.sent["send"] += x.nbytes  # point-to-point: the tensor once
        self.calls["send"] += 1

    def _a2a_bytes(self, x: torch.Tensor, counts: list[int], me: int, exchanged: bool) -> int:
        row = x.element_size() * math.prod(x.shape[1:])
        away = sum(c for j, c in enumerate(counts) if j != me) * row
        return away + (COUNT_BYTES * (len(counts) - 1) if exchanged else 0)


class TorchComm(_Counted):
    """torch.distributed for the collectives of one rank process; `groups` are every group of
    the mesh (each process must create them all, in the same order)."""

    def __init__(self, groups: list[list[int]]):
        import torch.distributed as dist

        super().__init__()
        self.dist, self.rank = dist, dist.get_rank()
        self.groups: dict[tuple[int, ...], object] = {}
        for g in groups:
            key = tuple(g)
            if key not in self.groups and len(key) > 1:
                self.groups[key] = dist.new_group(list(key))

    def _pg(self, group: list[int]):
        if list(group) == list(range(self.dist.get_world_size())):
            return None  # the default group: the world
        if tuple(group) not in self.groups:
            raise RuntimeError(f"rank {self.rank}: no process group {list(group)} (the mesh made {list(self.groups)})")
        return self.groups[tuple(group)]

    def all_reduce(self, x, group):
        y = x.clone().contiguous()
        if len(group) > 1:
            self.dist.all_reduce(y, group=self._pg(group))
            self._count("all_reduce", y.nbytes, len(group))
        return y

    def all_gather(self, x, group, dim):
        if len(group) == 1:
            return x.clone()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in group]
        self.dist.all_gather(parts, x, group=self._pg(group))
        self._count("all_gather", x.nbytes, len(group))
        return torch.cat(parts, dim)

    def reduce_scatter(self, x, group, dim):
        if len(group) == 1:
            return x.clone()
        chunks = [c.contiguous() for c in x.chunk(len(group), dim)]
        out = torch.empty_like(chunks[0])
        self.dist.reduce_scatter(out, chunks, group=self._pg(group))
        self._count("reduce_scatter", x.nbytes, len(group))
        return out

    def all_to_all(self, x, counts, group, received=None):
        me = group.index(self.rank)
        if len(group) == 1:
            return x.clone(), list(counts)
        pg, exchanged = self._pg(group), received is None
        if exchanged:
            got = torch.empty(len(group), dtype=torch.int64)
            self.dist.all_to_all_single(got, torch.tensor(counts, dtype=torch.int64), group=pg)
            received = [int(c) for c in got.tolist()]
        x = x.contiguous()
        out = x.new_empty((sum(received), *x.shape[1:]))
        self.dist.all_to_all_single(out, x, output_split_sizes=list(received), input_split_sizes=list(counts),
                                    group=pg)
        self.sent["all_to_all"] += self._a2a_bytes(x, counts, me, exchanged)
        self.calls["all_to_all"] += 1
        return out, list(received)


    def send(self, x: torch.Tensor, dst: int) -> None:
        """Point-to-point to rank `dst` (a pipeline stage's handover); bounded by the group's timeout."""
        x = x.contiguous()
        self.dist.send(x, dst)
        self._count_p2p(x)

    def recv(self, buf: torch.Tensor, src: int) -> torch.Tensor:
        self.dist.recv(buf, src)
        return buf


def init_process_group(rank: int, world: int, init_method: str, timeout_s: float, backend: str = "gloo") -> None:
    """Join the rank processes; `timeout_s` bounds the rendezvous and every collective after it."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


class Exchange:
    """Where the simulated ranks meet: the k-th call of a group by each member shares one slot."""

    def __init__(self, timeout_s: float = 60.0):
        self.cv = threading.Condition()
        self.slots: dict[tuple, dict[int, object]] = {}
        self.readers: Counter = Counter()
        self.seq: Counter = Counter()
        self.timeout_s, self.failed = timeout_s, None

    def fail(self, why: str) -> None:
        with self.cv:
            self.failed = why
            self.cv.notify_all()

    def meet(self, rank: int, group: list[int], value) -> list:
        g = tuple(group)
        with self.cv:
            key = (g, self.seq[(rank, g)])
            self.seq[(rank, g)] += 1
            slot = self.slots.setdefault(key, {})
            slot[rank] = value
            self.cv.notify_all()
            done = self.cv.wait_for(lambda: len(slot) == len(g) or self.failed, self.timeout_s)
            if self.failed:
                raise RuntimeError(f"rank {rank}: another simulated rank failed: {self.failed}")
            if not done:
                missing = sorted(set(g) - set(slot))
                raise TimeoutError(f"rank {rank}: rank(s) {missing} did not reach collective {key[1]} of group "
                                   f"{list(g)} within {self.timeout_s:.0f} s")
            values = [slot[r] for r in g]
            self.readers[key] += 1
            if self.readers[key] == len(g):
                del self.slots[key], self.readers[key]
            return values


class SimComm(_Counted):
    """One simulated rank's view of an `Exchange`."""

    def __init__(self, rank: int, exchange: Exchange):
        super().__init__()
        self.rank, self.exchange = rank, exchange

    def all_reduce(self, x, group):
        values = self.exchange.meet(self.rank, group, x)
        if len(group) > 1:
            self._count("all_reduce", x.nbytes, len(group))
        return functools.reduce(operator.add, values).clone()

    def all_gather(self, x, group, dim):
        values = self.exchange.meet(self.rank, group, x)
        if len(group) > 1:
            self._count("all_gather", x.nbytes, len(group))
        return torch.cat(values, dim)

    def reduce_scatter(self, x, group, dim):
        values = self.exchange.meet(self.rank, group, x)
        if len(group) > 1:
            self._count("reduce_scatter", x.nbytes, len(group))
        total = functools.reduce(operator.add, values)
        return total.chunk(len(group), dim)[group.index(self.rank)].clone()

    def all_to_all(self, x, counts, group, received=None):
        me = group.index(self.rank)
        values = self.exchange.meet(self.rank, group, (x, list(counts)))
        mine = [torch.split(v, c)[me] for v, c in values]
        got = [c[me] for _, c in values]
        if received is not None and list(received) != got:
            raise RuntimeError(f"rank {self.rank}: expected {received} rows from the group, got {got}")
        if len(group) > 1:
            self.sent["all_to_all"] += self._a2a_bytes(x, counts, me, received is None)
            self.calls["all_to_all"] += 1
        return torch.cat(mine), got


    def send(self, x: torch.Tensor, dst: int) -> None:
        self.exchange.meet(self.rank, [self.rank, dst], x.clone())
        self._count_p2p(x)

    def recv(self, buf: torch.Tensor, src: int) -> torch.Tensor:
        x = self.exchange.meet(self.rank, [src, self.rank], None)[0]
        if x.shape != buf.shape or x.dtype != buf.dtype:
            raise RuntimeError(f"rank {self.rank}: expected {buf.dtype} {list(buf.shape)} from rank {src}, "
                               f"got {x.dtype} {list(x.shape)}")
        return buf.copy_(x)


class ShapeComm(_Counted):
    """The communicator while a rank's model is captured: torch.export and the capture's own
    eager call need results of the right shapes only (they name outputs and make example
    states), so each primitive answers from this rank alone. Never used to compute. It counts
    what a real rank would send for each call (on meta tensors too), which is how `k3c plan`
    prices a mesh from the rank's eager model."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def all_reduce(self, x, group):
        if len(group) > 1:
            self._count("all_reduce", x.nbytes, len(group))
        return x.clone()

    def all_gather(self, x, group, dim):
        if len(group) > 1:
            self._count("all_gather", x.nbytes, len(group))
        return torch.cat([x] * len(group), dim)

    def reduce_scatter(self, x, group, dim):
        if len(group) > 1:
            self._count("reduce_scatter", x.nbytes, len(group))
        return x.chunk(len(group), dim)[group.index(self.rank)].clone()

    def all_to_all(self, x, counts, group, received=None):
        if len(group) > 1:  # this rank's own rows as it addresses them (the others' are not here)
            self.sent["all_to_all"] += self._a2a_bytes(x, counts, group.index(self.rank), received is None)
            self.calls["all_to_all"] += 1
        if received is not None and sum(received) != x.shape[0]:  # the rows the caller knows will come
            return x.new_zeros((sum(received), *x.shape[1:])), list(received)
        return x.clone(), list(counts)

    def expect(self, kind: str, nbytes: float) -> None:
        """One call of `kind` whose bytes the caller priced (an exchange on meta tensors, whose
        row counts only routing on real data would give)."""
        self.sent[kind] += nbytes
        self.calls[kind] += 1
