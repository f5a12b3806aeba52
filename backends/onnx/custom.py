"""The ONNX lowerings of k3c's recurrent, fused and chunked ops: each IR node becomes one
node of the custom domain `k3c` whose body (functions/) ships inside the model (cell "fn"
of the support matrix, in the `onnx` table of k3c.backends.tables).

    IR op                  k3c-domain op (attributes)
    kda, attention, ...    the function of the op's own name (functions/: `op_function`)
                           kda is the recurrence: the chunk-delta-rule pass decides whether
                           a prefill runs chunked, as chunk_prepare/scan/output
    short_conv             short_conv | short_conv_silu (channels)
    situ / gated_mlp       situ | situ_identity_up, gated_mlp_{situ,silu}[...]
    chunk_prepare          chunk_prepare_{channel,head,none,linear} (chunk_size)
    chunk_output           chunk_output (scale), T passed as a fifth input `length`
    ...                    see README.md for the full table

A variant suffix appears where an IR attribute changes the structure of the body (an
activation, a gate kind); numeric attributes stay attributes of the node.
"""

from __future__ import annotations

from ...ir import Graph, Node
from ..tables import builtin
from .builder import LoweringError

# The function bodies compute in fp32 (their constants and casts are fp32).
BODY_FLOATS = ("f32",)


def _f32_body(node: Node, graph: Graph) -> tuple[bool, str]:
    floats = {graph.types[v].dtype for v in node.inputs + node.outputs} - {"i64", "i32", "bool"}
    if not floats <= set(BODY_FLOATS):
        return False, f"the k3c-domain body of {node.op} is f32 only (got {', '.join(sorted(floats))})"
    return True, ""


def lowers(*ops: str):
    return builtin("onnx", *ops, kind="fn", supports=_f32_body)


def _call(lx, node: Node, name: str, extra_inputs: list[str] | None = None, **attrs) -> None:
    ins = [lx.x(i) for i in node.inputs] + (extra_inputs or [])
    lx.call(name, ins, [lx.out(node, i) for i in range(len(node.outputs))], **attrs)


def call_lowering(op: str, kinds: dict[str, str]) -> None:
    """The lowering of an op whose body is the function of its own name (functions.op_function):
    one k3c-domain node with the attributes `kinds` names."""
    cast = {"float": float, "int": int}

    def lower(lx, node):
        a = lx.attrs(node)
        _call(lx, node, op, **{k: cast[kind](a[k]) for k, kind in kinds.items()})

    builtin("onnx", op, kind="fn", supports=_f32_body)(lower)


@lowers("short_conv")
def _short_conv(lx, node):
    """The depthwise Conv's group is an attribute: the node carries the weight's static C."""
    act = lx.attrs(node)["activation"]
    C = lx.type(node.inputs[1]).shape[0]
    if not isinstance(C, int):
        raise LoweringError(f"short_conv {node.outputs[0]}: the ONNX body needs a static channel count, "
                            f"the weight is {lx.type(node.inputs[1])}")
    _call(lx, node, "short_conv_silu" if act == "silu" else "short_conv", channels=C)


def _act_name(base: str, attrs: dict) -> tuple[str, dict]:
    """(function name, attributes) of an op with a gated activation (attrs: all of them)."""
    if attrs["act"] == "silu":
        return f"{base}_silu" if base else "silu_glu", {}
    beta, lb = float(attrs["beta"]), attrs["linear_beta"]
    name = f"{base}_situ" if base else "situ"
    if lb is None:
        return f"{name}_identity_up", {"beta": beta}
    return name, {"beta": beta, "linear_beta": float(lb)}


@lowers("situ")
def _situ(lx, node):
    name, attrs = _act_name("", {"act": "situ", **lx.attrs(node)})
    _call(lx, node, name, **attrs)


@lowers("gated_mlp", "moe_experts")
def _gated(lx, node):
    name, attrs = _act_name(node.op, lx.attrs(node))
    _call(lx, node, name, **attrs)


@lowers("chunk_prepare")
def _chunk_prepare(lx, node):
    a = lx.attrs(node)
    _call(lx, node, f"chunk_prepare_{a['gate']}", chunk_size=int(a["chunk_size"]))


@lowers("chunk_output")
def _chunk_output(lx, node):
    a = lx.attrs(node)
    _call(lx, node, "chunk_output", [lx.b.dim(a["T"])], scale=float(a["scale"]))
