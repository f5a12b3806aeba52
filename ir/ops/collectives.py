"""Collectives: ops whose result needs the other ranks of a group. Pure like every IR op; the
group is an attribute (the global ranks, in order), and the reference runs against the rank's
communicator (k3c.kernels.collectives: the simulator's, or torch.distributed in a rank process).

    all_reduce(x)                {group}              sum over the group
    all_gather(x)                {group, dim}         concatenation along dim, in group order
    reduce_scatter(x)            {group, dim}         the sum, this rank's 1/M along dim
    all_to_all(x, counts)        {group, rows}        counts[j] rows to member j (per-rank split sizes)
                                                      -> rows received [rows, ...], counts received
    moe_dispatch(h, idx)         {group, experts, rows}  each (token, slot) of the member's token slice
                                                      to the owner of its expert -> x [rows, D], ids, route
    moe_combine(y, route, w)     {group}              expert outputs back, weighted sum per token, gathered

`peers` (0: the whole group): the dispatch and combine of data-parallel ranks, where only
blocks of `peers` consecutive members hold the same tokens (kernels/collectives/naive.py).

`rows` is a dim the capture names (R1, R2, ...; attr kind "rows"): how many rows arrive is
only known when they do (the torch op's fake makes it a data-dependent size), so a value of
that length is never inside a backend's segment and a segment that starts after it binds it
from its input. No backend lowers these ops: the rank runner
runs them between segments (k3c.distributed), and passes/cost.py has the bytes they send.
"""

from __future__ import annotations

import math

from ...kernels import collectives as C
from .. import dims as D
from ..types import TensorType
from .spec import attr, defop, expect

GROUP = attr("ints")


def _members(group) -> int:
    expect(len(group) >= 1 and len(set(group)) == len(group) and min(group) >= 0, "group",
           f"a group lists distinct ranks >= 0, got {list(group)}")
    return len(group)


def _axis(x: TensorType, dim: int) -> int:
    expect(-x.rank <= dim < max(x.rank, 1), "axis", f"axis {dim} out of range for {x}")
    return dim % x.rank


def _reduce_infer(x: TensorType, *, group) -> list[TensorType]:
    _members(group)
    expect(x.dtype in ("f32", "f64", "bf16", "f16"), "dtype", f"all_reduce sums floats, got {x.dtype}")
    return [x]


def _gather_infer(x: TensorType, *, group, dim) -> list[TensorType]:
    M, d = _members(group), _axis(x, dim)
    shape = list(x.shape)
    shape[d] = D.normalize(shape[d] * M)
    return [x.with_shape(shape)]


def _scatter_infer(x: TensorType, *, group, dim) -> list[TensorType]:
    M, d = _members(group), _axis(x, dim)
    n = x.shape[d]
    expect(isinstance(n, int) and n % M == 0, "reduce-scatter",
           f"reduce_scatter splits dim {dim} of {x} in {M} equal parts: it must be a multiple of {M}")
    shape = list(x.shape)
    shape[d] = n // M
    return [x.with_shape(shape)]


def _a2a_infer(x: TensorType, counts: TensorType, *, group, rows) -> list[TensorType]:
    M = _members(group)
    expect(x.rank >= 1, "all-to-all", f"all_to_all sends rows of a tensor, got {x}")
    expect(counts.dtype == "i64" and counts.shape == (M,), "all-to-all",
           f"counts must be i64[{M}] (rows to each member), got {counts}")
    return [x.with_shape((rows, *x.shape[1:])), counts]


def _peers(M: int, peers: int) -> None:
    expect(peers == 0 or (peers >= 1 and M % peers == 0), "peers",
           f"peers must be 0 or divide the group of {M}, got {peers}")


def _dispatch_infer(h: TensorType, idx: TensorType, *, group, experts, rows, peers=0) -> list[TensorType]:
    M = _members(group)
    _peers(M, peers)
    expect(h.rank == 2 and idx.rank == 2 and idx.dtype == "i64" and D.equal(h.shape[0], idx.shape[0]), "moe-shape",
           f"moe_dispatch takes h [N, D] and idx i64[N, k], got {h}, {idx}")
    return [h.with_shape((rows, h.shape[1])), TensorType("i64", (rows, 1)),
            TensorType("i64", (D.normalize(idx.shape[0] * idx.shape[1] + 2 * M),))]


def _combine_infer(y: TensorType, route: TensorType, w: TensorType, *, group, peers=0) -> list[TensorType]:
    M = _members(group)
    _peers(M, peers)
    expect(y.rank == 2 and w.rank == 2 and route.dtype == "i64" and route.rank == 1, "moe-shape",
           f"moe_combine takes y [R, D], the route of moe_dispatch and w [N, k], got {y}, {route}, {w}")
    expect(D.equal(route.shape[0], w.shape[0] * w.shape[1] + 2 * M), "moe-shape",
           f"route {route} is not the route of an [N, k] = {w} dispatch over {M} ranks")
    return [y.with_shape((w.shape[0], y.shape[1]))]


def _sum_flops(ins, outs, a) -> int:
    return (len(a["group"]) - 1) * math.prod(ins[0])


NONE = lambda ins, outs, a: 0  # noqa: E731  (moves data, computes nothing)

defop("all_reduce", "x", attrs={"group": GROUP}, infer=_reduce_infer, flops=_sum_flops, families="collective",
      eager=True, ref=lambda x, group: C.current("all_reduce").all_reduce(x, list(group)),
      doc="y = the sum of x over the ranks of `group`")
defop("all_gather", "x", attrs={"group": GROUP, "dim": attr("int", 0)}, infer=_gather_infer, flops=NONE, eager=True,
      ref=lambda x, group, dim: C.current("all_gather").all_gather(x, list(group), dim), families="collective",
      doc="y = cat over the ranks of `group` (in order) of x, along `dim`")
defop("reduce_scatter", "x", attrs={"group": GROUP, "dim": attr("int", 0)}, infer=_scatter_infer,
      flops=_sum_flops, families="collective", eager=True,
      ref=lambda x, group, dim: C.current("reduce_scatter").reduce_scatter(x, list(group), dim),
      doc="y = this rank's 1/M (by its place in `group`) along `dim` of the sum of x over the group")
defop("all_to_all", "x counts", "y received", attrs={"group": GROUP, "rows": attr("rows")}, infer=_a2a_infer,
      flops=NONE, families="collective", eager=True,
      ref=lambda x, counts, group, rows=None: C.all_to_all(C.current("all_to_all"), x, counts, list(group)),
      doc="counts[j] rows of x, in order, to member j of `group`; y: the rows received, by source")
defop("moe_dispatch", "h idx", "x ids route",
      attrs={"group": GROUP, "experts": attr("int", lo=1), "rows": attr("rows"), "peers": attr("int", 0)},
      infer=_dispatch_infer, flops=NONE, families="collective moe", eager=True,
      ref=lambda h, idx, group, experts, rows=None, peers=0: C.moe_dispatch(C.current("moe_dispatch"), h, idx,
                                                                        list(group), experts, peers),
      doc="the (token, slot)s of this rank's token slice to the owners of their experts (experts per rank: "
          "`experts`); x: rows for this rank's experts + one padding row, ids: their local expert ids")
defop("moe_combine", "y route w", attrs={"group": GROUP, "peers": attr("int", 0)}, infer=_combine_infer,
      families="collective moe", eager=True,
      flops=lambda ins, outs, a: 2 * ins[2][0] * ins[2][1] * ins[0][1],
      ref=lambda y, route, w, group, peers=0: C.moe_combine(C.current("moe_combine"), y, route, w, list(group),
                                                          peers),
      doc="expert outputs back to their slots, sum_j w[n, j] * y_slot (fp32), the slices gathered: [N, D]")

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "moe_dispatch", "moe_combine")
