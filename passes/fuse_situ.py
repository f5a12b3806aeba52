"""fuse-situ: find the decomposed SiTU, make it one `situ` op, fold it into its GEMM.

torch.export leaves SiTU as ~8 elementwise nodes (kernels/situ/naive.py):

    beta * tanh(gate / beta) * sigmoid(gate) * linear_beta * tanh(up / linear_beta)

in any association of the multiplies, `gate / beta` possibly as `gate * (1 / beta)`, the
`up` clamp absent when linear_beta is None, and in bf16 models `cast`s to fp32 around it.
Rules, in the order they apply:

  situ-from-elementwise      the product above -> situ(gate, up) {beta, linear_beta}
  situ-casts                 cast(situ(cast(G), cast(U))) -> situ(G, U): situ computes in fp32
                             and returns its input dtype, so this is exact
  situ-into-gated-mlp        situ(x W_g^T, x W_u^T) -> gated_mlp(x, cat(W_g, W_u)) {act=situ}
  situ-into-moe-experts      moe_down(situ(gu[..., :I], gu[..., I:]), ...), gu = moe_gate_up(h, w13, idx)
                             -> moe_experts(h, w13, w2, idx, w) {act=situ}
  silu-glu-into-gated-mlp    the same two folds for SiLU-GLU, silu(g) * u (the ancestors and
  silu-glu-into-moe-experts  Kimi Linear): the fused ops carry act=silu

The dense MLP and the shared experts become `gated_mlp` (+ the `linear` down projection);
the routed experts become one `moe_experts`.
"""

from __future__ import annotations

import torch

from ..ir import OPS, Graph
from .builder import Builder
from .driver import Rule, apply_rules
from .pattern import Alt, Any, Const, Match, Op, Product
from .registry import register_pass


def _scaled(x: str, beta: str) -> Alt:
    """x / beta, or x * (1 / beta)."""
    return Alt(Op("div", Any(x), Const(beta)), Op("mul", Any(x), Const(beta + "_inv")))


GATE = [Op("tanh", _scaled("gate", "beta")), Const("beta"), Op("sigmoid", Any("gate"))]
UP_CLAMPED = [Op("tanh", _scaled("up", "linear_beta")), Const("linear_beta")]


def _betas_consistent(m: Match) -> bool:
    for beta in ("beta", "linear_beta"):
        if beta + "_inv" in m.consts and abs(m.const(beta + "_inv") * m.const(beta) - 1) > 1e-6:
            return False
    return m.type("gate").same_as(m.type("up")) and m.const("beta") != 0


def _situ(m: Match, b: Builder) -> str:
    lb = m.const("linear_beta") if "linear_beta" in m.consts else None
    return b.op("situ", [m["gate"], m["up"]], beta=float(m.const("beta")),
                linear_beta=None if lb is None else float(lb))


def _situ_casts(m: Match, b: Builder) -> str | None:
    g, u = m["G"], m["U"]
    if not (b.type(g).same_as(b.type(u)) and b.type(g).dtype == m.root.attrs["dtype"]):
        return None
    inner = m.node("s")
    return b.op("situ", [g, u], **inner.attrs)


def _merged_weight_name(a: str, b: str, what: str) -> str:
    """model.layers.0.mlp.gate_proj.weight, ...up_proj.weight -> model.layers.0.mlp.<what>.weight"""
    pa, pb = a.split("."), b.split(".")
    common = []
    for x, y in zip(pa, pb):
        if x != y:
            break
        common.append(x)
    return ".".join(common + [what, "weight"])


def _gated_mlp(act: str):
    def rewrite(m: Match, b: Builder) -> str | None:
        wg, wu = m.tensor("wg"), m.tensor("wu")
        if wg.shape != wu.shape or wg.dtype != wu.dtype:
            return None
        w = b.weight(_merged_weight_name(m["wg"], m["wu"], "gate_up_proj"), torch.cat([wg, wu], 0))
        return b.op("gated_mlp", [m["x"], w], act=act, **_act_attrs(m, act))

    return rewrite


def _act_attrs(m: Match, act: str) -> dict:
    if act == "silu":
        return {}
    a = OPS["situ"].full_attrs(m.node("s").attrs)
    return {"beta": a["beta"], "linear_beta": a["linear_beta"]}


def _halves(m: Match) -> bool:
    """gu[..., :I] and gu[..., I:2I] on the last dim, I = w2's in-features, 2I = w13's rows."""
    rank = m.type("gu").rank
    I, two_i = m.type("w2").shape[2], m.type("w13").shape[1]
    lo, hi = (OPS["slice"].full_attrs(m.node(n).attrs) for n in ("lo", "hi"))
    return all(a["dim"] % rank == rank - 1 and a["step"] == 1 for a in (lo, hi)) and \
        (lo["start"], lo["end"], hi["start"], hi["end"]) == (0, I, I, two_i)


def _moe_experts(act: str):
    def rewrite(m: Match, b: Builder) -> str:
        return b.op("moe_experts", [m["h"], m["w13"], m["w2"], m["idx"], m["w"]], act=act, **_act_attrs(m, act))

    return rewrite


def _linear(x: str, w: str) -> Op:
    return Op("linear", Any(x), Any(w))


def _gate_up_slices():
    gu = Op("moe_gate_up", Any("h"), Any("w13"), Any("idx"), name="gu")
    return Op("slice", gu, name="lo"), Op("slice", gu, name="hi")


def _experts_pattern(act_pattern) -> Op:
    return Op("moe_down", act_pattern, Any("w2"), Any("idx"), Any("w"))


def _has_weights(*names: str):
    return lambda m: all(m.is_weight(n) for n in names)


LO, HI = _gate_up_slices()
RULES = [
    Rule("situ-from-elementwise", Product(*GATE, *UP_CLAMPED), _situ, where=_betas_consistent),
    Rule("situ-from-elementwise", Product(*GATE, Any("up")), _situ, where=_betas_consistent),
    Rule("situ-casts", Op("cast", Op("situ", Op("cast", Any("G"), where=lambda a: a["dtype"] == "f32"),
                                     Op("cast", Any("U"), where=lambda a: a["dtype"] == "f32"), name="s")),
         _situ_casts),
    Rule("situ-into-gated-mlp", Op("situ", _linear("x", "wg"), _linear("x", "wu"), name="s"), _gated_mlp("situ"),
         where=_has_weights("wg", "wu")),
    Rule("silu-glu-into-gated-mlp", Op("mul", Op("silu", _linear("x", "wg")), _linear("x", "wu")), _gated_mlp("silu"),
         where=_has_weights("wg", "wu")),
    Rule("situ-into-moe-experts", _experts_pattern(Op("situ", LO, HI, name="s")), _moe_experts("situ"),
         where=_halves),
    Rule("silu-glu-into-moe-experts", _experts_pattern(Op("mul", Op("silu", LO), HI)), _moe_experts("silu"),
         where=_halves),
]


@register_pass("fuse-situ")
def fuse_situ(graph: Graph):
    """SiTU chains -> situ; situ / SiLU-GLU with their gate/up GEMM -> gated_mlp, moe_experts."""
    return apply_rules(graph, RULES)
