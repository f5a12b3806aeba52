"""compute-dtype: compute in one floating dtype whatever the model stores.

A model released in BF16 runs on the CPU backends in float32, as llama.cpp does: every
floating value of a lower precision (bf16, f16) becomes `dtype` (graph inputs and outputs,
the recurrent state and caches included), the casts down to bf16 that the eager model makes
go, `const`/`full`/`arange`/`mxfp4_decode` produce `dtype`, and each weight keeps its stored
dtype: it is cast where it is read (one cast per weight; the backends run a cast of a weight
once, at load). Storage stays what the checkpoint holds; the arithmetic is float32.

Option: dtype (default f32). A graph without lower-precision values is left as it is.
"""

from __future__ import annotations

from ..ir import OPS, Graph, Node, TensorType
from .registry import register_pass

LOW = frozenset({"bf16", "f16"})
_DTYPE_ATTR_OPS = frozenset({"const", "full", "arange", "mxfp4_decode"})


def _retyped(t: TensorType, dtype: str) -> TensorType:
    return t.with_dtype(dtype) if t.dtype in LOW else t


@register_pass("compute-dtype", dtype="f32")
def compute_dtype(graph: Graph, dtype: str = "f32"):
    """Lower-precision activations, state and outputs in `dtype`; weights cast where read."""
    if not any(t.dtype in LOW for v, t in graph.types.items() if v not in graph.weights):
        return {}
    sites = {"activations": 0, "weight-casts": 0, "casts-dropped": 0}
    alias: dict[str, str] = {}  # value -> what replaces it
    casts: dict[str, str] = {}  # low-precision weight -> its cast
    types = {v: t for v, t in graph.types.items() if v in graph.weights}
    for v in graph.inputs:
        types[v] = _retyped(graph.types[v], dtype)
    nodes: list[Node] = []

    def use(v: str) -> str:
        v = alias.get(v, v)
        if v in graph.weights and graph.types[v].dtype in LOW:
            if v not in casts:
                casts[v] = _fresh(graph, types, f"{v}.{dtype}")
                types[casts[v]] = graph.types[v].with_dtype(dtype)
                nodes.append(Node("cast", [v], [casts[v]], {"dtype": dtype}, {}))
                sites["weight-casts"] += 1
            return casts[v]
        return v

    for node in graph.nodes:
        ins = [use(i) for i in node.inputs]
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
    return {k: n for k, n in sites.items() if n}


def _fresh(graph: Graph, types: dict, base: str) -> str:
    name, i = base, 0
    while name in graph.types or name in types:
        i += 1
        name = f"{base}_{i}"
    return name
