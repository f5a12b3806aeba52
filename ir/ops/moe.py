"""Routed-expert ops with static shapes: top-k indices select each (token, slot)'s expert."""

from __future__ import annotations

import math

from ...kernels.moe.naive import moe_down, moe_gate_up
from .. import dims as D
from ..types import TensorType
from .recurrent import _fmt, _same_dims
from .spec import defop, expect


def _gate_up_infer(h: TensorType, w13: TensorType, idx: TensorType) -> list[TensorType]:
    expect(h.rank == 2 and w13.rank == 3 and D.equal(w13.shape[2], h.shape[1]), "moe-shape",
           f"moe_gate_up takes h [N, D] and w13 [E, 2I, D]; got {h}, {w13}")
    expect(idx.rank == 2 and D.equal(idx.shape[0], h.shape[0]) and idx.dtype == "i64", "moe-shape",
           f"idx must be i64[N, k] with h's N, got {idx}")
    return [h.with_shape((h.shape[0], idx.shape[1], w13.shape[1]))]


defop("moe_gate_up", "h w13 idx", "gu", infer=_gate_up_infer, ref=moe_gate_up, eager=True, families="moe",
      flops=lambda ins, outs, a: 2 * math.prod(outs[0]) * ins[0][1],
      doc="gu[n, j] = w13[idx[n, j]] @ h[n]")


def _down_infer(a: TensorType, w2: TensorType, idx: TensorType, w: TensorType) -> list[TensorType]:
    expect(a.rank == 3 and w2.rank == 3 and D.equal(w2.shape[2], a.shape[2]), "moe-shape",
           f"moe_down takes a [N, k, I] and w2 [E, D, I]; got {a}, {w2}")
    expect(_same_dims(idx.shape, a.shape[:2]) and _same_dims(w.shape, a.shape[:2]), "moe-shape",
           f"idx and w must be {_fmt(a.shape[:2])}, got {idx}, {w}")
    return [a.with_shape((a.shape[0], w2.shape[1]))]


defop("moe_down", "a w2 idx w", "y", infer=_down_infer, ref=moe_down, eager=True, families="moe",
      flops=lambda ins, outs, a: 2 * math.prod(ins[0]) * ins[1][1] + math.prod(outs[0]) * ins[2][1],
      doc="y[n] = sum_j w[n, j] * w2[idx[n, j]] @ a[n, j] (fp32 accumulate)")
