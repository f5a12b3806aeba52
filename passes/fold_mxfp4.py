"""fold-mxfp4: fold the exact MXFP4 decode of the experts into the expert ops that read them,
as MLC-LLM folds dequantization into its matmuls:

  moe-experts-mxfp4    moe_experts(h, decode(p13, s13), decode(p2, s2), idx, w)
                       -> moe_experts_mxfp4(h, p13, s13, p2, s2, idx, w)
  moe-gate-up-mxfp4    moe_gate_up(h, decode(p13, s13), idx) -> moe_gate_up_mxfp4(h, p13, s13, idx)
  moe-down-mxfp4       moe_down(a, decode(p2, s2), idx, w)  -> moe_down_mxfp4(a, p2, s2, idx, w)

A backend with a kernel that reads codes (TVM, Triton) then never holds the decoded experts;
one without runs the fused op's decomposition (the decode, then the dense op). Each decode
folds only where its one reader is the expert op and it decodes to the dtype the op computes in.
"""

from __future__ import annotations

from ..ir import Graph
from .driver import Rule, apply_rules
from .pattern import Any, Match, Op
from .registry import register_pass


def _decoded(name: str) -> Op:
    return Op("mxfp4_decode", Any(f"{name}_packed"), Any(f"{name}_scale"), name=name)


def _to(compute: str):
    """The decodes produce the dtype of the op's activations (`compute` names that input)."""
    return lambda m: all(m.node(w).attrs.get("dtype", "f32") == m.type(compute).dtype
                         for w in ("w13", "w2") if w in m)


def _experts(m: Match, b) -> str:
    ins = [m["h"], m["w13_packed"], m["w13_scale"], m["w2_packed"], m["w2_scale"], m["idx"], m["w"]]
    return b.op("moe_experts_mxfp4", ins, name=m.root.outputs[0], **m.root.attrs)


RULES = [
    Rule("moe-experts-mxfp4", Op("moe_experts", Any("h"), _decoded("w13"), _decoded("w2"), Any("idx"), Any("w")),
         _experts, where=_to("h")),
    Rule("moe-gate-up-mxfp4", Op("moe_gate_up", Any("h"), _decoded("w13"), Any("idx")),
         lambda m, b: b.op("moe_gate_up_mxfp4", [m["h"], m["w13_packed"], m["w13_scale"], m["idx"]],
                           name=m.root.outputs[0]), where=_to("h")),
    Rule("moe-down-mxfp4", Op("moe_down", Any("a"), _decoded("w2"), Any("idx"), Any("w")),
         lambda m, b: b.op("moe_down_mxfp4", [m["a"], m["w2_packed"], m["w2_scale"], m["idx"], m["w"]],
                           name=m.root.outputs[0]), where=_to("a")),
]


@register_pass("fold-mxfp4")
def fold_mxfp4(graph: Graph):
    """mxfp4_decode feeding an expert op -> the expert op on the codes."""
    return apply_rules(graph, RULES)
