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
activation, a gate kind); numeric attributes stay attributes of the node. Each lowering's
table entry lists its variants and which one a node takes (`Lowering.variants`, `.variant`),
so `supports` refuses a node whose body does not exist and `k3c ops` lists them.
"""

from __future__ import annotations

from ...ir import OPS, Node
from ..tables import builtin
from .builder import LoweringError

# The function bodies compute in fp32 (their constants and casts are fp32).
BODY_FLOATS = ("f32",)


def lowers(*ops: str, variants: tuple[str, ...], variant):
    """Register a lowering that emits one k3c-domain node, the function `variant(node)` names
    (one of `variants`: the table knows every body a node may need)."""
    return builtin("onnx", *ops, kind="fn", floats=BODY_FLOATS, variants=variants, variant=variant)


def _call(lx, node: Node, name: str, inputs: dict, extra_inputs: list[str] | None = None, **attrs) -> None:
    """The node as one k3c-domain node of function `name` (the variant its table entry names)
    over its inputs (an absent optional one left out)."""
    ins = [lx.x(v) for v in inputs.values() if v is not None] + (extra_inputs or [])
    lx.call(name, ins, lx.outs(node), **attrs)


def call_lowering(op: str, kinds: dict[str, str]) -> None:
    """The lowering of an op whose body is the function of its own name (functions.op_function):
    one k3c-domain node with the attributes `kinds` names."""
    cast = {"float": float, "int": int}

    def lower(lx, node, **inputs):
        a = lx.attrs(node)
        _call(lx, node, op, inputs, **{k: cast[kind](a[k]) for k, kind in kinds.items()})

    lowers(op, variants=(op,), variant=lambda node: op)(lower)


def _attrs(node: Node) -> dict:
    return OPS[node.op].full_attrs(node.attrs)


def _conv_variant(node: Node) -> str:
    return "short_conv_silu" if _attrs(node)["activation"] == "silu" else "short_conv"


@lowers("short_conv", variants=("short_conv", "short_conv_silu"), variant=_conv_variant)
def _short_conv(lx, node, x, w, state):
    """The depthwise Conv's group is an attribute: the node carries the weight's static C."""
    C = lx.type(w).shape[0]
    if not isinstance(C, int):
        raise LoweringError(f"short_conv {node.outputs[0]}: the ONNX body needs a static channel count, "
                            f"the weight is {lx.type(w)}")
    _call(lx, node, _conv_variant(node), dict(x=x, w=w, state=state), channels=C)


def _act_variant(node: Node) -> str:
    """The function of an op with a gated activation: `situ`, or `<op>_situ` / `<op>_silu`,
    `_identity_up` where SiTU has no linear_beta (the up half passes unclamped)."""
    a = {"act": "situ", **_attrs(node)}
    name = "situ" if node.op == "situ" else f"{node.op}_{a['act']}"
    return name + "_identity_up" if a["act"] == "situ" and a["linear_beta"] is None else name


def _act_attrs(lx, node: Node) -> dict:
    a = {"act": "situ", **lx.attrs(node)}
    if a["act"] == "silu":
        return {}
    lb = a["linear_beta"]
    return {"beta": float(a["beta"])} | ({} if lb is None else {"linear_beta": float(lb)})


@lowers("situ", variants=("situ", "situ_identity_up"), variant=_act_variant)
def _situ(lx, node, gate, up):
    _call(lx, node, _act_variant(node), dict(gate=gate, up=up), **_act_attrs(lx, node))


def _gated(lx, node, **inputs):  # gated_mlp (x, w) and moe_experts (h, w13, w2, idx, w)
    _call(lx, node, _act_variant(node), inputs, **_act_attrs(lx, node))


for _op in ("gated_mlp", "moe_experts"):
    lowers(_op, variants=tuple(f"{_op}_{v}" for v in ("situ", "situ_identity_up", "silu")),
           variant=_act_variant)(_gated)

GATES = ("channel", "head", "none", "linear")  # chunk_prepare's gate kinds, each a body of its own


def _prepare_variant(node: Node) -> str:
    return f"chunk_prepare_{_attrs(node)['gate']}"


@lowers("chunk_prepare", variants=tuple(f"chunk_prepare_{g}" for g in GATES), variant=_prepare_variant)
def _chunk_prepare(lx, node, q, k, v, beta, g):
    _call(lx, node, _prepare_variant(node), dict(q=q, k=k, v=v, beta=beta, g=g),
          chunk_size=int(lx.attrs(node)["chunk_size"]))


@lowers("chunk_output", variants=("chunk_output",), variant=lambda node: "chunk_output")
def _chunk_output(lx, node, q_decayed, aqk, v_new, start_states):
    a = lx.attrs(node)
    _call(lx, node, "chunk_output", dict(q_decayed=q_decayed, aqk=aqk, v_new=v_new, start_states=start_states),
          [lx.b.dim(a["T"])], scale=float(a["scale"]))
