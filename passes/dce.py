"""dce: dead code elimination. A node none of whose outputs reaches a graph output goes,
and so do the weights nothing reads any more. Ops are pure, so nothing else is live."""

from __future__ import annotations

from collections import Counter

from ..ir import Graph
from .driver import drop_unused_weights
from .registry import register_pass


def live_nodes(graph: Graph) -> list:
    """The nodes some graph output depends on, in graph order."""
    live = set(graph.output_values)
    keep = []
    for n in reversed(graph.nodes):
        if any(o in live for o in n.outputs):
            keep.append(n)
            live.update(n.inputs)
    return keep[::-1]


@register_pass("dce")
def dce(graph: Graph) -> Counter:
    """Remove nodes whose outputs nothing uses, and unused weights."""
    keep = live_nodes(graph)
    sites = Counter({"dead-node": len(graph.nodes) - len(keep)})
    graph.nodes = keep
    sites["unused-weight"] = drop_unused_weights(graph)
    graph.prune_types()
    return +sites
