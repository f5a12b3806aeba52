"""fold-latent-moe: fold what is linear around the latent experts, and MLA decode.

Each fold is exact algebra (only rounding changes) and is kept only where the cost model
(passes/cost.py) says it does not make FLOPs or bytes worse:

  merge-sibling-linears        linears reading one input -> one linear over the concatenated
                               weights + split (router logits and latent down-projection; MLA's
                               q_a_proj, kv_a_proj_with_mqa and gate; KDA's projections). The
                               shared-expert gate/up are already one GEMM: fuse-situ's gated_mlp.
  latent-norm-into-up-proj     linear(rms_norm(y, n), W_up) -> linear(rms_norm(y), W_up diag(n))
                               for the routed experts' output (K3's latent MoE)
  norm-weight-into-linear      the same fold for any norm whose only user is one linear or
                               gated_mlp (MLA's q_a_layernorm, an input norm once its linears
                               are merged)
  routing-scale-into-experts   moe(..., w * c) -> moe(..., w) with the expert down weights c * w2:
                               sum_j (c w_j) W2 a_j = sum_j w_j (c W2) a_j; c = 1 is just dropped
  mla-absorbed                 decode only: mla_attention(q, ckv, krope, W_kv_b) ->
                               mla_attention_absorbed(q, ckv, krope, W_UK, W_UV): W_UK folds into
                               the query, W_UV applies after attention; cheaper when T << cache
"""

from __future__ import annotations

from collections import Counter

import torch

from ..ir import Graph
from . import cost as C
from .builder import Builder
from .manager import Rule, apply_rules, register_pass, remove_dead, replace_outputs
from .pattern import Any, Const, Match, Op, Weight, maybe_cast

# ------------------------------------------------------------ merge sibling linears


def _weight_part(name: str, prefix_len: int) -> str:
    parts = name.split(".")
    if parts[-1] == "weight":
        parts = parts[:-1]
    return ".".join(parts[prefix_len:]) or parts[-1]


def merged_name(names: list[str]) -> str:
    """a.b.q_proj.weight, a.b.k_proj.weight -> a.b.q_proj-k_proj.weight"""
    split = [n.split(".") for n in names]
    prefix = 0
    while all(len(s) > prefix + 1 and s[prefix] == split[0][prefix] for s in split):
        prefix += 1
    head = ".".join(split[0][:prefix])
    body = "-".join(_weight_part(n, prefix) for n in names)
    return f"{head}.{body}.weight" if head else f"{body}.weight"


def _sibling_groups(graph: Graph) -> list[list]:
    users = graph.users()
    groups: dict[tuple, list] = {}
    for n in graph.nodes:
        if n.op != "linear" or len(n.inputs) != 2 or not graph.is_weight(n.inputs[1]):
            continue
        if len(users[n.inputs[1]]) != 1 or n.inputs[1] in graph.output_values:
            continue  # a shared weight would be stored twice
        key = (n.inputs[0], graph.types[n.inputs[1]].dtype, graph.types[n.inputs[1]].shape[1])
        groups.setdefault(key, []).append(n)
    return [g for g in groups.values() if len(g) > 1]


def merge_sibling_linears(graph: Graph) -> int:
    sites = 0
    for members in _sibling_groups(graph):
        x = members[0].inputs[0]
        weights = [graph.weights[n.inputs[1]] for n in members]
        b = Builder(graph, members[0])
        w = b.weight(merged_name([n.inputs[1] for n in members]), torch.cat(weights, 0))
        y = b.op("linear", [x, w], name=members[0].outputs[0] + "_merged")
        parts = b.op("split", [y], name=y, dim=graph.types[x].rank - 1, sizes=[int(t.shape[0]) for t in weights])
        before, after = C.nodes_cost(graph, members), C.nodes_cost(graph, b.nodes)
        if after.bytes > before.bytes or after.flops > before.flops:
            continue
        b.commit()
        for n, p in zip(members, parts):
            replace_outputs(graph, n, [p])
        remove_dead(graph, members)
        sites += 1
    return sites


# ---------------------------------------------------------------- norm weights


def _normed() -> Op:
    return maybe_cast(Op("rms_norm", Any("x"), Weight("n"), name="norm"), name="cast")


def _fold_norm(m: Match, b: Builder) -> str:
    g = b.graph
    norm = m.node("norm")
    y = b.op("rms_norm", [norm.inputs[0]], name=norm.outputs[0], eps=norm.attrs["eps"])
    if "cast" in m:
        y = b.cast(y, m.node("cast").attrs["dtype"])
    W, n = g.weights[m["W"]], g.weights[m["n"]]
    w = b.weight(m["W"] + ".normed", (W.float() * n.float()[None, :]).to(W.dtype))
    return b.op(m.root.op, [y, w], name=m.root.outputs[0], **m.root.attrs)


def _own_weight(m: Match) -> bool:
    """W is read by this node only, so folding does not store a second copy."""
    return len(m.ctx.users.get(m["W"], ())) == 1 and m["W"] not in m.ctx.graph.output_values


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
        if not b.graph.is_weight(w2) or len(m.ctx.users[w2]) != 1:
            return None
        t = b.graph.weights[w2]
        inputs[w2_at] = b.weight(w2 + ".scaled", (t.float() * c).to(t.dtype))
    return b.op(node.op, inputs, name=node.outputs[0], **node.attrs)


def _scale_fits(m: Match) -> bool:
    return m.type("w").same_as(m.ctx.type(m.root.inputs[-1]))


# --------------------------------------------------------------------- MLA absorbed


def _absorb(m: Match, b: Builder) -> str:
    q, ckv, krope, wkv = m.root.inputs
    H, Dq = b.type(q).shape[2], b.type(q).shape[3]
    Dc, Dr, Dv = b.type(ckv).shape[2], b.type(krope).shape[2], m.root.attrs["v_head_dim"]
    Dn = Dq - Dr
    w = b.graph.weights[wkv].reshape(H, Dn + Dv, Dc)
    base = wkv.removesuffix(".weight")
    w_uk = b.weight(base + ".w_uk", w[:, :Dn].contiguous())
    w_uv = b.weight(base + ".w_uv", w[:, Dn:].contiguous())
    return b.op("mla_attention_absorbed", [q, ckv, krope, w_uk, w_uv], name=m.root.outputs[0],
                scale=m.root.attrs["scale"])


def _in_decode(m: Match) -> bool:
    return m.ctx.graph.meta.get("entry") == "decode"


def _cheaper(rewrite):
    """Keep the rewrite only when the cost model says it is no worse (else leave the site)."""

    def guarded(m: Match, b: Builder):
        out = rewrite(m, b)
        before, after = C.nodes_cost(b.graph, list(m.nodes)), C.nodes_cost(b.graph, b.nodes)
        if after.flops > before.flops or after.bytes > before.bytes:
            b.nodes = []
            return None
        return out

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
    Rule("mla-absorbed", Op("mla_attention", Any(), Any(), Any(), Weight()), _cheaper(_absorb), where=_in_decode),
]


@register_pass("fold-latent-moe")
def fold_latent_moe(graph: Graph) -> Counter:
    """Merge sibling GEMMs, fold norm weights and the routing scale into weights, absorb MLA in decode."""
    sites = Counter({"merge-sibling-linears": merge_sibling_linears(graph)})
    sites.update(apply_rules(graph, RULES))
    return +sites
