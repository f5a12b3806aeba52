"""fold-latent-moe: fold what is linear around the latent experts, and MLA decode.

Each fold is exact algebra, kept only where the cost model (passes/cost.py) says it makes
neither FLOPs nor bytes worse; a product folded into a weight goes only into a float32 one (or
is a power-of-two scale): BF16 rounding of it is no fp32-level change, and flips MoE routing:

  merge-sibling-linears        linears reading one input -> one GEMM + split (merge_siblings.py;
                               the shared-expert gate/up are fuse-situ's gated_mlp already)
  latent-norm-into-up-proj     linear(rms_norm(y, n), W_up) -> linear(rms_norm(y), W_up diag(n))
                               for the routed experts' output (K3's latent MoE)
  norm-weight-into-linear      the same fold for any norm whose only user is one linear or
                               gated_mlp (MLA's q_a_layernorm, an input norm once its linears
                               are merged)
  routing-scale-into-experts   moe(..., w * c) -> moe(..., w) with the expert down weights c * w2:
                               sum_j (c w_j) W2 a_j = sum_j w_j (c W2) a_j; c = 1 is just dropped
  mla-absorbed                 decode steps (T = 1): mla_attention(q, ckv, krope, W_kv_b) ->
                               mla_attention_absorbed(q, ckv, krope, W_UK, W_UV): W_UK folds into
                               the query, W_UV applies after attention; cheaper when T << cache
                               (mla_attention_cached -> mla_attention_absorbed_cached alike)
"""

from __future__ import annotations

import math
from collections import Counter

from ..ir import Graph, decode_step, named_inputs
from . import cost as C
from .builder import Builder
from .driver import Rule, apply_rules
from .merge_siblings import merge_sibling_linears
from .pattern import Any, Const, Match, Op, Weight, maybe_cast
from .registry import register_pass

# ---------------------------------------------------------------- norm weights


def _normed() -> Op:
    return maybe_cast(Op("rms_norm", Any("x"), Weight("n"), name="norm"), name="cast")


def _fold_norm(m: Match, b: Builder) -> str:
    norm = m.node("norm")
    y = b.op("rms_norm", [norm.inputs[0]], name=norm.outputs[0], eps=norm.attrs["eps"])
    if "cast" in m:
        y = b.cast(y, m.node("cast").attrs["dtype"])
    W, n = m.tensor("W"), m.tensor("n")
    w = b.weight(m["W"] + ".normed", (W.float() * n.float()[None, :]).to(W.dtype))
    return b.op(m.root.op, [y, w], name=m.root.outputs[0], **m.root.attrs)


def _own_weight(m: Match) -> bool:
    """W is read by this node only, so folding does not store a second copy, and it is float32,
    so the folded product is rounded as finely as the arithmetic is."""
    return m.single_use("W") and m.type("W").dtype in _FINE


_FINE = frozenset({"f32", "f64"})


def _exact_scale(c: float, dtype: str) -> bool:
    """t * c rounds at float32 level or better in `dtype`: a float32 t, or c a power of two."""
    return dtype in _FINE or (c != 0 and math.frexp(abs(c))[0] == 0.5)


def _from_routed_experts(m: Match) -> bool:
    """The norm reads the routed experts' output (through a cast, in bf16 models)."""
    p = m.ctx.producers.get(m["x"])
    if p is not None and p.op == "cast":
        p = m.ctx.producers.get(p.inputs[0])
    return p is not None and p.op in ("moe_down", "moe_experts")

# ------------------------------------------------------------------ routing scale


def _routing_scale(m: Match, b: Builder) -> str | None:
    node, c = m.root, m.const("c")
    inputs = list(node.inputs)
    inputs[-1] = m["w"]
    if c != 1:
        w2_at = 2 if node.op == "moe_experts" else 1
        w2 = inputs[w2_at]
        if not b.is_weight(w2) or len(m.ctx.users[w2]) != 1 or not _exact_scale(c, b.type(w2).dtype):
            return None
        t = b.tensor(w2)
        inputs[w2_at] = b.weight(w2 + ".scaled", (t.float() * c).to(t.dtype))
    return b.op(node.op, inputs, name=node.outputs[0], **node.attrs)


def _scale_fits(m: Match) -> bool:
    return m.type("w").same_as(m.ctx.type(m.root.inputs[-1]))


# --------------------------------------------------------------------- MLA absorbed


def _absorb(m: Match, b: Builder) -> str:
    """mla_attention -> mla_attention_absorbed; over a fixed-capacity cache (models/serving.py)
    mla_attention_cached -> mla_attention_absorbed_cached, its `positions` passed on."""
    q, ckv, krope, wkv, *positions = m.root.inputs
    H, Dq = b.type(q).shape[2], b.type(q).shape[3]
    Dc, Dr, Dv = b.type(ckv).shape[2], b.type(krope).shape[2], m.root.attrs["v_head_dim"]
    Dn = Dq - Dr
    w = b.tensor(wkv).reshape(H, Dn + Dv, Dc)
    base = wkv.removesuffix(".weight")
    w_uk = b.weight(base + ".w_uk", w[:, :Dn].contiguous())
    w_uv = b.weight(base + ".w_uv", w[:, Dn:].contiguous())
    op = "mla_attention_absorbed_cached" if positions else "mla_attention_absorbed"
    return b.op(op, [q, ckv, krope, w_uk, w_uv, *positions], name=m.root.outputs[0], scale=m.root.attrs["scale"])


def _decode_step(m: Match) -> bool:
    """A decode step (ir.dims.decode_step): the query attends to a cache, T << S."""
    return decode_step(m.ctx.graph, named_inputs(m.root)["q"])


def _cheaper(rewrite):
    """Keep the rewrite only when the cost model says it is no worse (else leave the site:
    nothing the rewrite staged reaches the graph)."""

    def guarded(m: Match, b: Builder):
        out = rewrite(m, b)
        return out if C.no_worse(C.nodes_cost(m.ctx.graph, list(m.nodes)), C.staged_cost(b)) else None

    return guarded


RULES = [
    Rule("latent-norm-into-up-proj", Op("linear", _normed(), Weight("W")), _cheaper(_fold_norm),
         where=lambda m: _own_weight(m) and _from_routed_experts(m)),
    Rule("norm-weight-into-linear", Op({"linear", "gated_mlp"}, _normed(), Weight("W")), _cheaper(_fold_norm),
         where=_own_weight),
    Rule("routing-scale-into-experts",
         Op("moe_down", *[Any() for _ in range(3)], Op("mul", Any("w"), Const("c"))),
         _cheaper(_routing_scale), where=_scale_fits),
    Rule("routing-scale-into-experts",
         Op("moe_experts", *[Any() for _ in range(4)], Op("mul", Any("w"), Const("c"))),
         _cheaper(_routing_scale), where=_scale_fits),
    Rule("mla-absorbed", Op("mla_attention", Any(), Any(), Any(), Weight()), _cheaper(_absorb), where=_decode_step),
    Rule("mla-absorbed", Op("mla_attention_cached", Any(), Any(), Any(), Weight(), Any()), _cheaper(_absorb),
         where=_decode_step),
]


@register_pass("fold-latent-moe")
def fold_latent_moe(graph: Graph) -> Counter:
    """Merge sibling GEMMs, fold norm weights and the routing scale into weights, absorb MLA in decode."""
    sites = Counter({"merge-sibling-linears": merge_sibling_linears(graph)})
    sites.update(apply_rules(graph, RULES))
    return +sites
