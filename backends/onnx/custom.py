"""The lowering table of k3c's recurrent, fused and chunked ops: each IR node becomes one
node of the custom domain `k3c` whose body (functions/) ships inside the model.

    IR op                  k3c-domain op (attributes)
    kda                    kda (scale) when T = 1, else kda_chunked (scale, chunk_size)
    short_conv             short_conv | short_conv_silu
    situ / gated_mlp       situ | situ_identity_up, gated_mlp_{situ,silu}[...]
    chunk_prepare          chunk_prepare_{channel,head,none,linear} (chunk_size)
    chunk_output           chunk_output (scale), T passed as a fifth input `length`
    ...                    see README.md for the full table

A variant suffix appears where an IR attribute changes the structure of the body (an
activation, a gate kind); numeric attributes stay attributes of the node.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from ...ir import Node

CUSTOM: dict[str, Callable] = {}
DEFAULT_CHUNK_SIZE = 64


def lowers(*ops: str):
    def register(fn):
        for op in ops:
            CUSTOM[op] = fn
        return fn
    return register


def _call(lx, node: Node, name: str, extra_inputs: list[str] | None = None, **attrs) -> None:
    ins = [lx.x(i) for i in node.inputs] + (extra_inputs or [])
    lx.call(name, ins, [lx.out(node, i) for i in range(len(node.outputs))], **attrs)


def _is_single_step(lx, node: Node) -> bool:
    T = lx.type(node.inputs[0]).shape[1]
    return not isinstance(T, sympy.Basic) and int(T) == 1


def _recurrent(op: str):
    def lower(lx, node: Node):
        scale = float(node.attrs["scale"])
        chunk = lx.chunk_size
        if _is_single_step(lx, node) or not chunk:
            _call(lx, node, op, scale=scale)
        else:
            _call(lx, node, f"{op}_chunked", scale=scale, chunk_size=int(chunk))
    return lower


for _op in ("kda", "gated_delta_rule", "delta_rule", "linear_attention"):
    CUSTOM[_op] = _recurrent(_op)


@lowers("short_conv")
def _short_conv(lx, node):
    act = node.attrs.get("activation", "none")
    _call(lx, node, "short_conv_silu" if act == "silu" else "short_conv")


def _act_name(base: str, attrs: dict) -> tuple[str, dict]:
    """(function name, attributes) of an op with a gated activation."""
    act = attrs.get("act", "situ")
    if act == "silu":
        return f"{base}_silu" if base else "silu_glu", {}
    beta, lb = float(attrs.get("beta", 4.0)), attrs.get("linear_beta")
    name = f"{base}_situ" if base else "situ"
    if lb is None:
        return f"{name}_identity_up", {"beta": beta}
    return name, {"beta": beta, "linear_beta": float(lb)}


@lowers("situ")
def _situ(lx, node):
    name, attrs = _act_name("", {"act": "situ", **node.attrs})
    _call(lx, node, name, **attrs)


@lowers("gated_mlp")
def _gated_mlp(lx, node):
    name, attrs = _act_name("gated_mlp", node.attrs)
    _call(lx, node, name, **attrs)


@lowers("moe_experts")
def _moe_experts(lx, node):
    name, attrs = _act_name("moe_experts", node.attrs)
    _call(lx, node, name, **attrs)


@lowers("moe_gate_up", "moe_down")
def _moe_pieces(lx, node):
    _call(lx, node, node.op)


@lowers("causal_attention", "mla_attention", "mla_attention_absorbed")
def _attention(lx, node):
    _call(lx, node, node.op, scale=float(node.attrs["scale"]))


@lowers("attn_res_mix")
def _attn_res(lx, node):
    _call(lx, node, "attn_res_mix", eps=float(node.attrs["eps"]))


@lowers("chunk_prepare")
def _chunk_prepare(lx, node):
    _call(lx, node, f"chunk_prepare_{node.attrs['gate']}", chunk_size=int(node.attrs["chunk_size"]))


@lowers("chunk_state_scan")
def _chunk_state_scan(lx, node):
    _call(lx, node, "chunk_state_scan")


@lowers("chunk_output")
def _chunk_output(lx, node):
    _call(lx, node, "chunk_output", [lx.b.dim(node.attrs["T"])], scale=float(node.attrs["scale"]))
