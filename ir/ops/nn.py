"""Reductions, linear algebra, norms, embedding and indexing ops."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...kernels.topk import topk
from .. import dims as D
from ..types import TensorType
from .spec import attr, defop, expect

EPS = attr("float", lo=0)


def _per_element(n: int):
    return lambda ins, outs, a: n * math.prod(ins[0])


def _reduce_infer(x: TensorType, *, dims, keepdim) -> list[TensorType]:
    for d in dims:
        expect(-x.rank <= d < max(x.rank, 1), "axis", f"axis {d} out of range for rank {x.rank}")
    axes = {d % x.rank for d in dims}
    shape = [1 if i in axes else s for i, s in enumerate(x.shape) if keepdim or i not in axes]
    return [x.with_shape(shape)]


for _name, _fn in {"reduce_sum": torch.sum, "reduce_mean": torch.mean, "reduce_max": torch.amax}.items():
    defop(_name, "x", attrs={"dims": attr("ints"), "keepdim": attr("bool", False)}, infer=_reduce_infer,
          ref=lambda x, dims, keepdim, _fn=_fn: _fn(x, dim=tuple(dims), keepdim=keepdim),
          flops=_per_element(1), families="reduce", doc=f"{_name} over `dims`")


def _softmax_infer(x: TensorType, *, dim) -> list[TensorType]:
    expect(-x.rank <= dim < max(x.rank, 1), "axis", f"axis {dim} out of range for rank {x.rank}")
    return [x]


defop("softmax", "x", attrs={"dim": attr("int")}, infer=_softmax_infer,
      ref=lambda x, dim: torch.softmax(x, dim), flops=_per_element(4), families="reduce", doc="softmax along `dim`")


def _linear_infer(x: TensorType, w: TensorType, b: TensorType | None = None) -> list[TensorType]:
    expect(w.rank == 2, "linear", f"linear weight must be [out, in], got {w}")
    expect(D.equal(x.shape[-1], w.shape[1]), "linear",
           f"linear input {x} does not match weight {w} (in-features {D.to_str(w.shape[1])})")
    expect(x.dtype == w.dtype, "dtype", f"linear input {x.dtype} and weight {w.dtype} differ")
    if b is not None:
        expect(b.rank == 1 and D.equal(b.shape[0], w.shape[0]), "linear", f"bias {b} does not fit weight {w}")
    return [x.with_shape(x.shape[:-1] + (w.shape[0],))]


def _linear_flops(ins, outs, a):
    return 2 * math.prod(outs[0]) * ins[0][-1] + (math.prod(outs[0]) if len(ins) > 2 else 0)


defop("linear", "x w b?", infer=_linear_infer, ref=F.linear, flops=_linear_flops, families="matmul",
      doc="y = x w^T (+ b); w [out, in]")


def _matmul_infer(a: TensorType, b: TensorType) -> list[TensorType]:
    expect(a.rank >= 2 and b.rank >= 2, "matmul", f"matmul needs rank >= 2 operands, got {a} and {b}")
    expect(D.equal(a.shape[-1], b.shape[-2]), "matmul", f"matmul inner dims differ: {a} @ {b}")
    expect(a.dtype == b.dtype, "dtype", f"matmul operands {a.dtype} and {b.dtype} differ")
    from .elementwise import broadcast_shapes

    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [a.with_shape(batch + (a.shape[-2], b.shape[-1]))]


defop("matmul", "a b", infer=_matmul_infer, ref=torch.matmul, families="matmul",
      flops=lambda ins, outs, a: 2 * math.prod(outs[0]) * ins[0][-1],
      doc="y = a @ b, batch dims broadcast")


def _embedding_infer(w: TensorType, ids: TensorType) -> list[TensorType]:
    expect(w.rank == 2, "embedding", f"embedding table must be [vocab, dim], got {w}")
    expect(ids.dtype in ("i64", "i32"), "dtype", f"embedding ids must be integers, got {ids.dtype}")
    return [w.with_shape(ids.shape + (w.shape[1],))]


defop("embedding", "weight ids", infer=_embedding_infer, ref=lambda w, ids: F.embedding(ids, w), families="gather",
      flops=lambda ins, outs, a: 0,
      doc="y = weight[ids]")


def _norm_infer(x: TensorType, w: TensorType | None = None, b: TensorType | None = None, *, eps) -> list[TensorType]:
    for p in (w, b):
        expect(p is None or (p.rank == 1 and D.equal(p.shape[0], x.shape[-1])), "norm",
               f"norm parameter {p} does not match the last dim of {x}")
    return [x]


defop("rms_norm", "x w?", attrs={"eps": EPS}, infer=_norm_infer,
      ref=lambda x, w=None, eps=1e-5: F.rms_norm(x, (x.shape[-1],), w, eps), families="norm",
      flops=lambda ins, outs, a: (4 + (len(ins) > 1)) * math.prod(ins[0]),
      doc="y = x / sqrt(mean(x^2, -1) + eps) * w")
defop("layer_norm", "x w? b?", attrs={"eps": EPS}, infer=_norm_infer,
      ref=lambda x, w=None, b=None, eps=1e-5: F.layer_norm(x, (x.shape[-1],), w, b, eps), families="norm",
      flops=lambda ins, outs, a: (7 + len(ins) - 1) * math.prod(ins[0]),
      doc="y = (x - mean) / sqrt(var + eps) * w + b over the last dim")


def _topk_infer(x: TensorType, *, k, dim) -> list[TensorType]:
    expect(-x.rank <= dim < max(x.rank, 1), "axis", f"axis {dim} out of range for rank {x.rank}")
    d = dim % x.rank
    expect(not isinstance(x.shape[d], int) or k <= x.shape[d], "topk", f"k={k} exceeds dim {x.shape[d]}")
    shape = list(x.shape)
    shape[d] = k
    return [x.with_shape(shape), TensorType("i64", tuple(shape))]


defop("topk", "x", "values indices", attrs={"k": attr("int", lo=1), "dim": attr("int", -1)}, infer=_topk_infer,
      ref=topk, eager=True, flops=_per_element(1), families="index",
      doc="the k largest along `dim`, sorted, and their indices; ties: the lower index first")


def _gather_infer(x: TensorType, idx: TensorType, *, dim) -> list[TensorType]:
    expect(-x.rank <= dim < max(x.rank, 1), "axis", f"axis {dim} out of range for rank {x.rank}")
    expect(idx.dtype in ("i64", "i32"), "dtype", f"gather indices must be integers, got {idx.dtype}")
    expect(idx.rank == x.rank, "gather", f"gather index rank {idx.rank} differs from input rank {x.rank}")
    return [x.with_shape(idx.shape)]


defop("gather", "x idx", attrs={"dim": attr("int")}, infer=_gather_infer,
      ref=lambda x, idx, dim: torch.gather(x, dim, idx), flops=lambda ins, outs, a: 0, families="index",
      doc="y[i][j] = x[i][idx[i][j]] along `dim`")
