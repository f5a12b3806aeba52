"""chunk-delta-rule: rewrite each recurrent delta-rule op of a prefill graph into the chunked
(WY/UT) form, the three ops of ir/ops/chunked.py:

    o, S' = kda(q, k, v, g, beta, S) {scale}
 -> q_dec, k_dec, w, u, aqk, decay = chunk_prepare(q, k, v, beta, g) {chunk_size=C, gate="channel"}
    v_new, starts, S' = chunk_state_scan(w, u, k_dec, decay, S)       # the only serial part: T/C steps
    o = chunk_output(q_dec, aqk, v_new, starts) {scale, T}             # fp32; a cast back to v's dtype

The gate is the op's gate kind, read from its spec (`OPS[op].delta`, ir/ops/delta_family.py):
"head" for gated_delta_rule, "none" for delta_rule, and so for any member a user declares.
A member with the normaliser (gate "linear": linear attention) has no WY transform; its z
rides along as an extra all-ones value column, so S and z share one scan, and o is the ratio
of the two parts of the output:

    v1 = concat(v, 1);  S1 = concat(S, z)  ->  o1, S1' as above  ->  o = o1[..., :V] / o1[..., V:]

Padding T up to a multiple of C is inside chunk_prepare (zeros) and chunk_output (cut back
to T), so any T works. A single step (T the constant 1: decode) keeps the recurrent form.
This pass is the one place where the prefill form is decided; a backend that takes a
recurrent op whole (onnxruntime's LinearAttention) asks for it with `keep`.

`by="flops"` lets the cost model choose per node: the chunked form is built, costed with each
op's FLOP rule at the cost binding (passes/cost.py: T = 1024) and kept only when it has fewer
FLOPs than the recurrent op, else the rewrite is declined and the op stays whole. A backend
whose target has no matrix units to spend the chunked form's extra FLOPs on asks for it (TVM
on `llvm`): for K = V = 64 and C = 64 the recurrence is 7 K V FLOPs a token and head against
the chunked form's 16.4 K V, and the two both grow linearly in T, so the choice holds at
every length. (The recurrence runs its B x H heads in parallel and T in sequence; FLOPs do
not see that, so a batch of fewer heads than cores is better chunked on many cores.)
Options: chunk_size (default DEFAULT_CHUNK_SIZE, 64), keep (ops to leave whole, default none),
by ("always", the default, or "flops").
"""

from __future__ import annotations

from ..ir import OPS, Graph, decode_step, named_inputs
from ..ir.ops.delta_family import members
from ..kernels.delta.chunk import DEFAULT_CHUNK_SIZE
from .builder import Builder
from .cost import binding, node_cost
from .driver import Rule, apply_rules
from .pattern import Match, Op
from .registry import register_pass


def _base(m: Match) -> str:
    """kda_1.0 -> kda_1: new values are named after the op they replace."""
    return m.root.outputs[0].rsplit(".", 1)[0]


def _cheaper(m: Match, b: Builder, outs: list[str]) -> list[str] | None:
    """`outs` when the nodes `b` built have fewer FLOPs than the op they replace, else None."""
    env = binding(b.graph)
    types = {**b.graph.types, **b.types}
    chunked = sum(node_cost(b.graph, n, env, types).flops for n in b.nodes)
    return outs if chunked < node_cost(b.graph, m.root, env).flops else None


def _delta(chunk_size: int, by: str = "always"):
    def rewrite(m: Match, b: Builder) -> list[str] | None:
        node, base = m.root, _base(m)
        x = named_inputs(node)  # q k v [g] beta state, by name
        q, k, v, g, beta, state = x["q"], x["k"], x["v"], x.get("g"), x["beta"], x["state"]
        prep_in = [q, k, v, beta] + ([g] if g is not None else [])
        qd, kd, w, u, aqk, decay = b.op("chunk_prepare", prep_in, name=base, chunk_size=chunk_size,
                                        gate=OPS[node.op].delta.gate)
        v_new, starts, state_out = b.op("chunk_state_scan", [w, u, kd, decay, state], name=base)
        o = b.op("chunk_output", [qd, aqk, v_new, starts], name=f"{base}.o", scale=node.attrs["scale"],
                 T=b.type(q).shape[1])
        outs = [b.cast(o, b.type(v).dtype), state_out]
        return _cheaper(m, b, outs) if by == "flops" else outs

    return rewrite


def _normalised(chunk_size: int, by: str = "always"):
    def rewrite(m: Match, b: Builder) -> list[str] | None:
        x = named_inputs(m.root)
        q, k, v, state, z = x["q"], x["k"], x["v"], x["state"], x["z"]
        base = _base(m)
        B, T, H, V = b.type(v).shape
        K = b.type(q).shape[3]
        ones = b.op("full", [], name=f"{base}.ones", shape=[B, T, H, 1], value=1.0, dtype="f32")
        v1 = b.op("concat", [b.cast(v, "f32"), ones], name=f"{base}.v1", dim=3)
        z1 = b.op("reshape", [z], name=f"{base}.z1", shape=[B, H, K, 1])
        s1 = b.op("concat", [state, z1], name=f"{base}.s1", dim=3)
        qd, kd, w, u, aqk, decay = b.op("chunk_prepare", [q, k, v1], name=base, chunk_size=chunk_size,
                                        gate=OPS[m.root.op].delta.gate)
        v_new, starts, s1_out = b.op("chunk_state_scan", [w, u, kd, decay, s1], name=base)
        o1 = b.op("chunk_output", [qd, aqk, v_new, starts], name=f"{base}.o1", scale=m.root.attrs["scale"], T=T)
        num = b.op("slice", [o1], name=f"{base}.num", dim=3, start=0, end=V)
        den = b.op("slice", [o1], name=f"{base}.den", dim=3, start=V, end=V + 1)
        o = b.cast(b.op("div", [num, den], name=f"{base}.o"), b.type(v).dtype)
        s_out = b.op("slice", [s1_out], name=f"{base}.s", dim=3, start=0, end=V)
        z_col = b.op("slice", [s1_out], name=f"{base}.z", dim=3, start=V, end=V + 1)
        z_out = b.op("reshape", [z_col], name=f"{base}.z", shape=[B, H, K])
        outs = [o, s_out, z_out]
        return _cheaper(m, b, outs) if by == "flops" else outs

    return rewrite


def _many_tokens(m: Match) -> bool:
    """A decode step (ir.dims.decode_step: its entry, or a T of the constant 1): nothing to chunk."""
    return not decode_step(m.ctx.graph, named_inputs(m.root)["q"])


def chunkable() -> tuple[str, ...]:
    """The ops this pass chunks: every delta-family member declared now (ir/ops/delta_family.py)."""
    return tuple(sorted(members()))


def rules(chunk_size: int = DEFAULT_CHUNK_SIZE, keep=(), by: str = "always") -> list[Rule]:
    return [Rule("chunk-" + op.replace("_", "-"), Op(op, any_inputs=True),
                 (_normalised if form.normaliser else _delta)(chunk_size, by), where=_many_tokens)
            for op, form in sorted(members().items()) if op not in keep]


BY = ("always", "flops")


@register_pass("chunk-delta-rule", chunk_size=DEFAULT_CHUNK_SIZE, keep=[], by="always")
def chunk_delta_rule(graph: Graph, chunk_size: int = DEFAULT_CHUNK_SIZE, keep=(), by: str = "always"):
    """Every recurrent delta-family op (kda, gated_delta_rule, delta_rule, linear_attention, ...) ->
    its chunked form (prefill only)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk-delta-rule: chunk_size must be a positive int, got {chunk_size!r}")
    if by not in BY:
        raise ValueError(f"chunk-delta-rule: by must be one of {BY}, got {by!r}")
    unknown = sorted(set(keep) - set(chunkable()))
    if unknown:
        raise ValueError(f"chunk-delta-rule: keep names ops it does not chunk: {unknown}; it chunks {chunkable()}")
    return apply_rules(graph, rules(chunk_size, keep, by))
