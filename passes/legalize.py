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

from ..errors import RewriteError
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


def legalize(graph: Graph, supports: Supports, max_depth: int = 32) -> Counter:
    """Decompose, in place, every node `supports` refuses and whose op can be decomposed.

    Each node made by a decomposition remembers the ops it came from: an op that reappears
    among its own ancestors (a decomposition that uses the op itself, directly or through
    others) would decompose forever, and is a RewriteError naming the cycle, as is a chain
    deeper than `max_depth`."""
    sites: Counter = Counter()
    origin: dict[int, tuple[str, ...]] = {}  # id(node) -> the ops it was decomposed from
    while True:
        todo = [n for n in graph.nodes if OPS[n.op].decompose is not None and not supports(n, graph)[0]]
        if not todo:
            return sites
        for node in todo:
            chain = origin.get(id(node), ()) + (node.op,)
            if node.op in chain[:-1]:
                cycle = " -> ".join(chain[chain.index(node.op):])
                raise RewriteError(f"op {node.op!r} decomposes into itself ({cycle}): the backend refuses it and "
                                   f"its decomposition must be written without it")
            if len(chain) > max_depth:
                raise RewriteError(f"op {chain[0]!r}: decompositions nested deeper than {max_depth} "
                                   f"({' -> '.join(chain[:6])} -> ...)")
            before = {id(n) for n in graph.nodes}
            decompose_node(graph, node)
            sites[node.op] += 1
            origin.update((id(n), chain) for n in graph.nodes if id(n) not in before)
