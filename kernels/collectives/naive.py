"""The definition of k3c's collectives, for one rank, against a communicator.

A collective is pure: the same inputs on every rank of its group give the same outputs. What
it computes needs the other ranks' inputs, so each op is written here for one rank in terms of
four primitives of a `Comm` (the simulator's computes them across in-process ranks, the rank
runner's calls torch.distributed):

    all_reduce(x, group)            sum over the group                       [*] -> [*]
    all_gather(x, group, dim)       concatenation along dim, in group order  [.., n, ..] -> [.., n * M, ..]
    reduce_scatter(x, group, dim)   the sum, this rank's 1/M along dim       [.., n * M, ..] -> [.., n, ..]
    all_to_all(x, counts, group, received=None)
                                    counts[j] rows of x (in order) to member j; returns the rows
                                    received, ordered by source, and how many came from each
                                    (`received`, when the caller knows it, saves exchanging counts)

`group` lists global ranks; a rank's place in it is its index. On top of those:

    moe_dispatch(h [N, D], idx [N, k], experts)  -> x [R, D], ids [R, 1], route
        Each member takes its slice of the N tokens (member i: rows floor(iN/M) to
        floor((i+1)N/M)), sends every (token, slot) of its slice to the member that owns the
        slot's expert (member e // experts), and receives the rows routed to its own experts,
        grouped by source, with their local expert ids. The last row of x is padding (zeros,
        expert 0), so x is never empty. `route` records what combine needs to send them back.
    moe_combine(y [R, D'], route, w [N, k])      -> out [N, D']
        Sends each expert output back to the slot it came from, sums a token's slots weighted
        by w (fp32, like moe_down), and gathers the members' slices, so every member ends with
        all N rows.

`peers` (both ops, 0: the whole group): data-parallel ranks hold different tokens, so only
each block of `peers` consecutive members (a copy's tp group, or the copies that share a dp
index: k3c/distributed/mesh.py) holds the same N tokens; a member takes its slice of its
block's tokens and combine gathers the slices within the block only.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Comm(Protocol):
    rank: int

    def all_reduce(self, x: torch.Tensor, group: list[int]) -> torch.Tensor: ...

    def all_gather(self, x: torch.Tensor, group: list[int], dim: int) -> torch.Tensor: ...

    def reduce_scatter(self, x: torch.Tensor, group: list[int], dim: int) -> torch.Tensor: ...

    def all_to_all(self, x: torch.Tensor, counts: list[int], group: list[int],
                   received: list[int] | None = None) -> tuple[torch.Tensor, list[int]]: ...


def token_slice(n: int, index: int, size: int) -> tuple[int, int]:
    """The rows [lo, hi) of `n` that member `index` of `size` takes: as even as integers allow."""
    return index * n // size, (index + 1) * n // size


def all_to_all(comm: Comm, x: torch.Tensor, counts: torch.Tensor, group: list[int]) -> tuple[torch.Tensor, ...]:
    y, received = comm.all_to_all(x, [int(c) for c in counts.tolist()], group)
    return y, torch.tensor(received, dtype=torch.int64)


def _block(M: int, me: int, peers: int) -> tuple[int, int]:
    """(first member of `me`'s block of peers, the block's size)."""
    P = peers or M
    if M % P:
        raise ValueError(f"peers={peers} does not divide a group of {M}")
    return me - me % P, P


def moe_dispatch(comm: Comm, h: torch.Tensor, idx: torch.Tensor, group: list[int],
                 experts: int, peers: int = 0) -> tuple[torch.Tensor, ...]:
    M, me = len(group), group.index(comm.rank)
    N, k = idx.shape
    first, P = _block(M, me, peers)
    lo, hi = token_slice(N, me - first, P)
    slots = idx[lo:hi].reshape(-1)
    owner = torch.div(slots, experts, rounding_mode="floor")
    order = torch.sort(owner, stable=True).indices  # slots grouped by owner, each group in token order
    send = torch.bincount(owner, minlength=M)
    rows = h[lo:hi].repeat_interleave(k, dim=0)[order]
    x, received = comm.all_to_all(rows, send.tolist(), group)
    ids, _ = comm.all_to_all((slots[order] % experts).unsqueeze(1), send.tolist(), group, received)
    x = torch.cat([x, x.new_zeros(1, x.shape[1])])
    ids = torch.cat([ids, ids.new_zeros(1, 1)])
    position = torch.full((N * k,), -1, dtype=torch.int64)  # where each slot of the slice sits in the send order
    position[lo * k + order] = torch.arange(order.numel())
    route = torch.cat([send, torch.tensor(received, dtype=torch.int64), position])
    return x, ids, route


def moe_combine(comm: Comm, y: torch.Tensor, route: torch.Tensor, w: torch.Tensor,
                group: list[int], peers: int = 0) -> torch.Tensor:
    M, me = len(group), group.index(comm.rank)
    N, k = w.shape
    first, P = _block(M, me, peers)
    send, received, position = route[:M], route[M:2 * M], route[2 * M:]
    back, _ = comm.all_to_all(y[:-1], received.tolist(), group, send.tolist())  # the padding row stays here
    lo, hi = token_slice(N, me - first, P)
    per_slot = back[position[lo * k:hi * k]].reshape(hi - lo, k, y.shape[1])  # a slice may be empty
    part = (w[lo:hi, :, None].float() * per_slot.float()).sum(1).to(y.dtype)
    block = range(first, first + P)
    sizes = [token_slice(N, j - first, P)[1] - token_slice(N, j - first, P)[0] if j in block else 0
             for j in range(M)]
    counts = [hi - lo if j in block else 0 for j in range(M)]
    out, _ = comm.all_to_all(part.repeat(P, 1), counts, group, sizes)  # all-gather of uneven slices (the block's)
    return out
