"""fuse-norms: the norms a kernel takes in one pass over the row, as single ops.

  gated-rms-norm   rms_norm(x, w) * sigmoid(gate) -> gated_rms_norm(x, gate, w)   (KDA's output)
  l2norm           x * rsqrt(sum(x^2, -1) + eps)  -> l2norm(x) {eps}             (KDA's q and k)

Both ops carry their decompositions, so a backend without a kernel for them (ONNX, TVM) gets
back the ops they were fused from; Triton runs each as one row kernel.
"""

from __future__ import annotations

from ..ir import Graph
from .driver import Rule, apply_rules
from .pattern import Any, Const, Match, Op
from .registry import register_pass


def _gated(m: Match, b) -> str:
    return b.op("gated_rms_norm", [m["x"], m["gate"], m["w"]], name=m.root.outputs[0], eps=m.node("norm").attrs["eps"])


def _gated_fits(m: Match) -> bool:
    x = m.type("x")
    return m.type("gate").same_as(x) and m.ctx.type(m.root.outputs[0]).same_as(x) and m.type("w").dtype == x.dtype


def _last_dim_sum(m: Match) -> bool:
    attrs, rank = m.node("total").attrs, m.type("x").rank
    return attrs.get("keepdim") is True and [d % rank for d in attrs["dims"]] == [rank - 1]


def _l2(m: Match, b) -> str:
    return b.op("l2norm", [m["x"]], name=m.root.outputs[0], eps=float(m.const("eps")))


RULES = [
    Rule("gated-rms-norm", Op("mul", Op("rms_norm", Any("x"), Any("w"), name="norm"), Op("sigmoid", Any("gate"))),
         _gated, where=_gated_fits),
    Rule("l2norm",
         Op("mul", Any("x"), Op("rsqrt", Op("add", Op("reduce_sum", Op("pow", Any("x"), Const("two", lambda c: c == 2)),
                                                      name="total"), Const("eps", lambda c: c >= 0)))),
         _l2, where=_last_dim_sum),
]


@register_pass("fuse-norms")
def fuse_norms(graph: Graph):
    """rms_norm(x) * sigmoid(gate) -> gated_rms_norm; x * rsqrt(sum(x^2) + eps) -> l2norm."""
    return apply_rules(graph, RULES)
