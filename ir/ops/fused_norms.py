"""Norms fused with their neighbours, created by the fuse-norms pass: KDA's gated output norm
and the l2norm of its queries and keys. Each carries its decomposition, so a backend without
a kernel for it runs the ops it was fused from."""

from __future__ import annotations

import math

import torch

from ...kernels.gated_rmsnorm.naive import gated_rmsnorm
from .. import dims as D
from ..types import TensorType
from .spec import attr, defop, expect


def _gated_infer(x: TensorType, gate: TensorType, w: TensorType, *, eps) -> list[TensorType]:
    expect(gate.same_as(x), "gate-shape", f"gated_rms_norm gate {gate} must match x {x}")
    expect(w.rank == 1 and D.equal(w.shape[0], x.shape[-1]) and w.dtype == x.dtype, "norm",
           f"gated_rms_norm weight {w} must be {x.dtype}[{D.to_str(x.shape[-1])}]")
    return [x]


def _gated_decompose(b, x, gate, w, *, eps):
    return [b.op("mul", [b.op("rms_norm", [x, w], eps=eps), b.op("sigmoid", [gate])])]


defop("gated_rms_norm", "x gate w", attrs={"eps": attr("float", lo=0)}, infer=_gated_infer, ref=gated_rmsnorm,
      decompose=_gated_decompose, flops=lambda ins, outs, a: 7 * math.prod(ins[0]), families="norm fused",
      doc="rms_norm(x, w) * sigmoid(gate) over the last dim: KDA's output norm in one kernel")


def _l2_infer(x: TensorType, *, eps) -> list[TensorType]:
    expect(x.rank >= 1, "norm", f"l2norm needs a last dim, got {x}")
    return [x]


def _l2_ref(x, eps):
    return x * torch.rsqrt(torch.sum(torch.pow(x, 2.0), dim=(x.dim() - 1,), keepdim=True) + eps)


def _l2_decompose(b, x, *, eps):
    t = b.type(x)
    sq = b.op("pow", [x, b.const(2.0, t.dtype)])
    total = b.op("reduce_sum", [sq], dims=[t.rank - 1], keepdim=True)
    return [b.op("mul", [x, b.op("rsqrt", [b.op("add", [total, b.const(eps, t.dtype)])])])]


defop("l2norm", "x", attrs={"eps": attr("float", lo=0)}, infer=_l2_infer, ref=_l2_ref, decompose=_l2_decompose,
      flops=lambda ins, outs, a: 3 * math.prod(ins[0]), families="norm fused",
      doc="x * rsqrt(sum(x^2, -1) + eps): the l2norm of KDA's queries and keys in one kernel")
