"""Legalizing a graph for a backend: every node the backend cannot lower whose op carries a
`decompose` rule is rewritten into that decomposition, until none is left.

    sites = legalize(graph, backend.supports)        # in place; {op: nodes decomposed}

Like torch's composite ops: a fused op a user declares runs on every backend through its
decomposition, and on a backend with a lowering of its own, as that lowering. A node that is
refused and has no decomposition stays, and the backend's support check names it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..ir import OPS, Graph, Node
from .builder import Builder
from .driver import replace

Supports = Callable[[Node, Graph], tuple[bool, str]]


def decompose_node(graph: Graph, node: Node) -> None:
    """Replace `node` by its op's decomposition (in place)."""
    spec = OPS[node.op]
    b = Builder(graph, node)
    outs = spec.decompose(b, *node.inputs, **spec.full_attrs(node.attrs))
    outs = [outs] if isinstance(outs, str) else list(outs)
    for o, want in zip(outs, node.outputs):
        if not b.type(o).same_as(graph.types[want]):
            raise AssertionError(f"the decomposition of {node.op} gives %{o}: {b.type(o)} for %{want}: "
                                 f"{graph.types[want]}")
    replace(graph, node, b, outs)


def legalize(graph: Graph, supports: Supports, max_rounds: int = 32) -> Counter:
    """Decompose, in place, every node `supports` refuses and whose op can be decomposed."""
    sites: Counter = Counter()
    for _ in range(max_rounds):
        todo = [n for n in graph.nodes if OPS[n.op].decompose is not None and not supports(n, graph)[0]]
        if not todo:
            return sites
        for node in todo:
            decompose_node(graph, node)
            sites[node.op] += 1
    raise RuntimeError(f"decompositions did not settle in {max_rounds} rounds (an op that decomposes into itself?)")
