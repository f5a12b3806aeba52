"""cse: common subexpression elimination. Two nodes with the same op, the same inputs (in
either order for a commutative op) and the same attributes compute the same thing: the
later one goes and its users read the earlier one's outputs. Ops are pure, so this is exact."""

from __future__ import annotations

from collections import Counter

from ..ir import OPS, Graph, family
from .registry import register_pass


def node_key(graph: Graph, node) -> tuple:
    inputs = tuple(node.inputs)
    if node.op in family("commutative"):
        inputs = tuple(sorted(inputs))
    attrs = tuple(sorted((k, repr(v)) for k, v in OPS[node.op].full_attrs(node.attrs).items()))
    return node.op, inputs, attrs, tuple((graph.types[o].dtype, graph.types[o].shape) for o in node.outputs)


@register_pass("cse")
def cse(graph: Graph) -> Counter:
    """Merge nodes that compute the same value."""
    rename: dict[str, str] = {}
    seen: dict[tuple, object] = {}
    kept = []
    for node in graph.nodes:
        node.inputs = [rename.get(i, i) for i in node.inputs]
        key = node_key(graph, node)
        first = seen.get(key)
        if first is None:
            seen[key] = node
            kept.append(node)
        else:
            rename.update(zip(node.outputs, first.outputs))
    graph.outputs = [(k, rename.get(v, v)) for k, v in graph.outputs]
    sites = Counter({"common-subexpression": len(graph.nodes) - len(kept)})
    graph.nodes = kept
    return +sites
