"""Cut a graph down to what some values need: the subgraph that computes them."""

from __future__ import annotations

from .graph import Graph


def extract(graph: Graph, values: list[str], name: str | None = None) -> Graph:
    """A copy of `graph` whose outputs are `values` (each named after itself), keeping only
    the nodes they depend on. Inputs stay as they are, so the same inputs run it."""
    producers = graph.producers()
    unknown = [v for v in values if v not in graph.types]
    if unknown:
        raise KeyError(f"{graph.name} has no value(s) {unknown}")
    live, stack = set(), list(values)
    while stack:
        v = stack.pop()
        if v in live:
            continue
        live.add(v)
        node = producers.get(v)
        if node is not None:
            stack.extend(node.inputs)
    g = graph.copy()
    g.name = name or f"{graph.name}.extract"
    g.nodes = [n for n in g.nodes if any(o in live for o in n.outputs)]
    g.outputs = [(v, v) for v in values]
    g.prune_types()
    return g
