"""compute-dtype: the compute policy of a model stored in a lower precision, decided once.

A model released in BF16 runs on the CPU backends in float32, as llama.cpp does: every
floating value of a lower precision (bf16, f16) becomes `dtype` (graph inputs and outputs,
the recurrent state and caches included), the casts down to bf16 that the eager model makes
go, `const`/`full`/`arange`/`mxfp4_decode` produce `dtype`, and each weight keeps its stored
dtype: it is cast where it is read (one cast per weight; the backends read the stored bytes
there, no widened copy). Storage stays what the checkpoint holds.

Option `gemm="bf16"` is the BF16 compute policy (`k3c.compile(..., compute="bf16")`): the
operands of every GEMM (ops of the `matmul` and `moe` families) that the model holds in BF16
are rounded to BF16 (`cast` to bf16 and back), so each GEMM multiplies BF16 operands and
accumulates in float32; its output stays float32. Everything else stays float32: the norms
and their statistics, the router (the model computes its logits from float32 operands, so
they are not rounded), sigmoid and top-k, softmax, the recurrent state and its update, the
residual sum. A GEMM the model already computes from float32 operands keeps them. The routed
experts' hidden (the activation between an expert's two GEMMs) stays float32 too: the fused
expert ops hold it inside, where no operand rounding reaches, and the unfused down-projection
(`KEEP_HIDDEN`) keeps it as well, so the policy is the same whatever the pipeline fuses.

Options: dtype (default f32), gemm (default f32, or bf16). A graph without lower-precision
values is left as it is; `graph.meta["compute"]` records the policy applied.
"""

from __future__ import annotations

from ..ir import OPS, Graph, Node, TensorType
from ..ir.ops.spec import family
from .registry import register_pass

LOW = frozenset({"bf16", "f16"})
POLICIES = ("f32", "bf16")  # k3c.compile(..., compute=): what `gemm` each names
_DTYPE_ATTR_OPS = frozenset({"const", "full", "arange", "mxfp4_decode"})
KEEP_HIDDEN = frozenset({"moe_down", "moe_down_mxfp4"})  # their first operand: the experts' hidden


def gemm_ops() -> frozenset[str]:
    """The ops whose operands the BF16 policy rounds: the GEMMs (read from OPS's families)."""
    return (family("matmul") | family("moe")) - family("collective")


def _retyped(t: TensorType, dtype: str) -> TensorType:
    return t.with_dtype(dtype) if t.dtype in LOW else t


@register_pass("compute-dtype", dtype="f32", gemm="f32")
def compute_dtype(graph: Graph, dtype: str = "f32", gemm: str = "f32") -> dict:
    """Lower-precision activations, state and outputs in `dtype`; weights cast where read;
    with `gemm="bf16"` the GEMMs' BF16 operands rounded to BF16 (float32 accumulation)."""
    if gemm not in POLICIES:
        raise ValueError(f"compute-dtype: gemm must be one of {', '.join(POLICIES)}, got {gemm!r}")
    if not any(t.dtype in LOW for v, t in graph.types.items() if v not in graph.weights):
        return {}
    sites = {"activations": 0, "weight-casts": 0, "casts-dropped": 0, "gemm-operands-bf16": 0}
    alias: dict[str, str] = {}  # value -> what replaces it
    casts: dict[str, str] = {}  # low-precision weight -> its cast
    rounded: dict[str, str] = {}  # activation -> its value rounded to bf16 (in `dtype`)
    types = {v: t for v, t in graph.types.items() if v in graph.weights}
    for v in graph.inputs:
        types[v] = _retyped(graph.types[v], dtype)
    nodes: list[Node] = []
    gemms = gemm_ops() if gemm == "bf16" else frozenset()

    def cast(v: str, to: str, base: str, meta: dict) -> str:
        out = _fresh(graph, types, base)
        types[out] = types[v].with_dtype(to)
        nodes.append(Node("cast", [v], [out], {"dtype": to}, dict(meta)))
        return out

    def use(v: str) -> str:
        v = alias.get(v, v)
        if v in graph.weights and graph.types[v].dtype in LOW:
            if v not in casts:
                casts[v] = cast(v, dtype, f"{v}.{dtype}", {})
                sites["weight-casts"] += 1
            return casts[v]
        return v

    def operand(original: str, v: str, meta: dict) -> str:
        """A GEMM operand: rounded to bf16 where the model holds it in bf16 (not a weight)."""
        if original in graph.weights or graph.types[original].dtype != "bf16":
            return v
        if v not in rounded:
            rounded[v] = cast(cast(v, "bf16", f"{v}.bf16", meta), dtype, f"{v}.bf16.{dtype}", meta)
            sites["gemm-operands-bf16"] += 1
        return rounded[v]

    for node in graph.nodes:
        ins = [use(i) for i in node.inputs]
        if node.op in gemms:
            ins = [i if k == 0 and node.op in KEEP_HIDDEN else operand(o, i, node.meta)
                   for k, (o, i) in enumerate(zip(node.inputs, ins))]
        attrs = dict(node.attrs)
        if node.op == "cast" and (attrs["dtype"] in LOW or types[ins[0]].dtype == attrs["dtype"]) \
                and types[ins[0]].dtype in (LOW | {dtype}):
            alias[node.outputs[0]] = ins[0]  # a cast down (or to what it already is): gone
            sites["casts-dropped"] += 1
            continue
        if node.op in _DTYPE_ATTR_OPS and attrs.get("dtype") in LOW:
            attrs["dtype"] = dtype
        spec = OPS[node.op]
        inferred = spec.infer(*[types[i] for i in ins], **spec.full_attrs(attrs))
        for o, t in zip(node.outputs, inferred):
            sites["activations"] += graph.types[o].dtype in LOW
            types[o] = t
        nodes.append(Node(node.op, ins, list(node.outputs), attrs, dict(node.meta)))
    graph.nodes = nodes
    graph.outputs = [(k, alias.get(v, v)) for k, v in graph.outputs]
    graph.types = types
    graph.meta["compute"] = gemm
    return {k: n for k, n in sites.items() if n}


def _fresh(graph: Graph, types: dict, base: str) -> str:
    name, i = base, 0
    while name in graph.types or name in types:
        i += 1
        name = f"{base}_{i}"
    return name
