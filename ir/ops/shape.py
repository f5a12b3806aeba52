"""Shape ops: reshape, permute, slice, concat, stack, split, expand."""

from __future__ import annotations

import sympy
import torch

from .. import dims as D
from ..types import TensorType
from .spec import attr, defop, expect


def NONE(ins, outs, a) -> int:
    """Shape ops do no arithmetic."""
    return 0


def _numel(shape) -> D.Dim:
    return D.normalize(sympy.Mul(*[sympy.sympify(d) for d in shape])) if shape else 1


def _reshape_infer(x: TensorType, *, shape) -> list[TensorType]:
    expect(D.equal(_numel(x.shape), _numel(shape)), "reshape",
           f"cannot reshape {x} to {list(map(D.to_str, shape))}: element counts differ")
    return [x.with_shape(shape)]


defop("reshape", "x", attrs={"shape": attr("shape")}, infer=_reshape_infer, flops=NONE,
      ref=lambda x, shape: x.reshape(tuple(shape)), families="shape view",
      doc="y = x viewed as `shape` (same element count)")


def _axis(d: int, rank: int) -> int:
    expect(-rank <= d < max(rank, 1), "axis", f"axis {d} out of range for rank {rank}")
    return d % max(rank, 1)


def _permute_infer(x: TensorType, *, perm) -> list[TensorType]:
    expect(sorted(perm) == list(range(x.rank)), "permute", f"perm {perm} is not a permutation of rank {x.rank}")
    return [x.with_shape(tuple(x.shape[p] for p in perm))]


defop("permute", "x", attrs={"perm": attr("ints")}, infer=_permute_infer, flops=NONE,
      ref=lambda x, perm: x.permute(*perm).contiguous(), families="shape",
      doc="y = x with its axes reordered by `perm`")


def _slice_len(n: D.Dim, start: D.Dim, end: D.Dim, step: int) -> D.Dim:
    if isinstance(n, int) and isinstance(start, int) and isinstance(end, int):
        return len(range(*slice(start, end, step).indices(n)))
    # symbolic: clamp `end` to n when it is the "to the end" sentinel
    length = D.normalize(sympy.sympify(end) - sympy.sympify(start))
    return length if step == 1 else D.normalize(sympy.ceiling(sympy.sympify(length) / step))


def _slice_ref(x: torch.Tensor, dim: int, start: int, end: int, step: int) -> torch.Tensor:
    index = [slice(None)] * x.dim()
    index[dim] = slice(start, end, step)
    return x[tuple(index)].contiguous()


def _slice_infer(x: TensorType, *, dim, start, end, step) -> list[TensorType]:
    d = _axis(dim, x.rank)
    n = x.shape[d]
    if isinstance(end, int):  # canonical bounds: 0 <= start <= end <= n (the frontend clamps them)
        expect(end >= 0 and (not isinstance(n, int) or end <= n) and end < 2**62, "slice",
               f"slice end {end} is outside dim {dim} of {x} (0 <= end <= {D.to_str(n)})")
    if isinstance(start, int):
        expect(start >= 0, "slice", f"slice start {start} must be >= 0 (the frontend makes it so)")
    shape = list(x.shape)
    shape[d] = _slice_len(n, start, end, step)
    return [x.with_shape(shape)]


defop("slice", "x",
      attrs={"dim": attr("int"), "start": attr("dim", 0), "end": attr("dim"), "step": attr("int", 1, lo=1)},
      infer=_slice_infer, ref=lambda x, dim, start, end, step: _slice_ref(x, dim, start, end, step), flops=NONE,
      families="shape view", doc="y = x[start:end:step] along `dim`")


def _concat_infer(*xs: TensorType, dim) -> list[TensorType]:
    expect(len(xs) >= 1, "arity", "concat needs at least one input")
    d = _axis(dim, xs[0].rank)
    for x in xs[1:]:
        expect(x.dtype == xs[0].dtype and x.rank == xs[0].rank, "concat",
               f"concat operands {xs[0]} and {x} differ in dtype or rank")
        for i in range(x.rank):
            expect(i == d or D.equal(x.shape[i], xs[0].shape[i]), "concat",
                   f"concat operands {xs[0]} and {x} differ off axis {d}")
    shape = list(xs[0].shape)
    shape[d] = D.normalize(sum(sympy.sympify(x.shape[d]) for x in xs))
    return [xs[0].with_shape(shape)]


defop("concat", "xs*", attrs={"dim": attr("int")}, infer=_concat_infer, flops=NONE,
      ref=lambda *xs, dim: torch.cat(xs, dim), families="shape", doc="y = cat(xs, dim)")


def _stack_infer(*xs: TensorType, dim) -> list[TensorType]:
    for x in xs[1:]:
        expect(x.same_as(xs[0]), "stack", f"stack operands differ: {xs[0]} vs {x}")
    shape = list(xs[0].shape)
    shape.insert(dim % (xs[0].rank + 1), len(xs))
    return [xs[0].with_shape(shape)]


defop("stack", "xs*", attrs={"dim": attr("int", 0)}, infer=_stack_infer, flops=NONE,
      ref=lambda *xs, dim: torch.stack(xs, dim), families="shape", doc="y = stack(xs, dim)")


def _split_infer(x: TensorType, *, dim, sizes) -> list[TensorType]:
    d = _axis(dim, x.rank)
    expect(D.equal(D.normalize(sum(sympy.sympify(s) for s in sizes)), x.shape[d]), "split",
           f"split sizes {sizes} do not add up to dim {D.to_str(x.shape[d])}")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[d] = s
        outs.append(x.with_shape(shape))
    return outs


defop("split", "x", "ys*", attrs={"dim": attr("int"), "sizes": attr("shape")}, infer=_split_infer, flops=NONE,
      ref=lambda x, dim, sizes: tuple(t.contiguous() for t in torch.split(x, list(sizes), dim)),
      num_outputs=lambda attrs: len(attrs["sizes"]), families="shape view",
      doc="ys = split(x, sizes, dim)")


def _expand_infer(x: TensorType, *, shape) -> list[TensorType]:
    expect(len(shape) >= x.rank, "expand", f"cannot expand {x} to fewer dims {shape}")
    pad = (1,) * (len(shape) - x.rank) + tuple(x.shape)
    for a, b in zip(pad, shape):
        expect(a == 1 or D.equal(a, b), "expand", f"cannot expand {x} to {list(map(D.to_str, shape))}")
    return [x.with_shape(shape)]


defop("expand", "x", attrs={"shape": attr("shape")}, infer=_expand_infer, flops=NONE,
      ref=lambda x, shape: x.expand(tuple(shape)).contiguous(), families="shape view",
      doc="y = x broadcast to `shape`")
