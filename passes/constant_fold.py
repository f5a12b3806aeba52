"""constant-fold: evaluate what does not depend on the inputs, and drop identities.

- A node whose inputs are all weights or `const` nodes is run once, here, with its
  reference: a 0-d result becomes a `const` node, anything else a new weight named after
  the weight it came from (`reshape(conv.weight)` -> weight `conv.weight.reshape`). Results
  larger than their inputs (an `expand`) and symbolic shapes stay in the graph.
- Identities go: `x * 1`, `x / 1`, `x + 0`, `x - 0`, a `cast` to x's own dtype, a `reshape`
  to x's own shape, and `reshape(reshape(x))` becomes one reshape.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from ..ir import Graph, Node, dims
from ..ir.interpret import run_node
from .builder import Builder
from .driver import Rule, apply_rules, remove_dead, rename_value, replace_outputs
from .pattern import Any, Const, Match, Op
from .registry import register_pass

FOLDABLE_LIMIT = 1 << 26  # elements: never materialise more than this in one folded weight


def _is_constant(graph: Graph, producers: dict[str, Node], value: str) -> bool:
    return graph.is_weight(value) or (value in producers and producers[value].op == "const")


def _numel(graph: Graph, value: str) -> int | None:
    shape = graph.types[value].shape
    return math.prod(shape) if all(dims.is_static(d) for d in shape) else None


def _foldable(graph: Graph, producers: dict[str, Node], node: Node) -> bool:
    if node.op == "const" or not node.inputs:
        return False
    if not all(_is_constant(graph, producers, i) for i in node.inputs):
        return False
    sizes = [_numel(graph, o) for o in node.outputs]
    if any(s is None or s > FOLDABLE_LIMIT for s in sizes):
        return False
    source = sum(_numel(graph, i) or 0 for i in set(node.inputs))
    return sum(sizes) <= max(source, 1)


def _fold_node(graph: Graph, node: Node, values: dict[str, torch.Tensor]) -> list[str]:
    outs = run_node(node, [values[i] for i in node.inputs], {})
    b = Builder(graph, node)
    weights = [i for i in node.inputs if graph.is_weight(i)]
    new = []
    for out_name, t in zip(node.outputs, outs):
        if t.dim() == 0 and not weights and not t.is_meta:
            new.append(b.op("const", [], name=out_name, value=t.item(), dtype=graph.types[out_name].dtype))
        else:
            suffix = f"{node.attrs['dtype']}" if node.op == "cast" else node.op
            new.append(b.weight(f"{weights[0]}.{suffix}" if weights else out_name, t.contiguous()))
    b.commit()
    return new


def fold_constants(graph: Graph) -> Counter:
    sites: Counter = Counter()
    producers = graph.producers()
    values: dict[str, torch.Tensor] = dict(graph.weights)
    for node in [n for n in graph.nodes if n.op == "const"]:
        values[node.outputs[0]] = run_node(node, [], {})[0]
    for node in list(graph.nodes):
        if not _foldable(graph, producers, node):
            continue
        new = _fold_node(graph, node, values)
        replace_outputs(graph, node, new)
        remove_dead(graph, [node])
        for i, (old, v) in enumerate(zip(node.outputs, new)):
            if v in graph.types and not graph.is_weight(v) and old not in graph.types:  # a const keeps the name
                rename_value(graph, v, old)
                new[i] = old
        producers = graph.producers()
        for v in new:
            if v in graph.types:
                values[v] = graph.weights[v] if graph.is_weight(v) else run_node(producers[v], [], {})[0]
        sites["fold-weights" if any(graph.is_weight(v) for v in new) else "fold-consts"] += 1
    return sites


# ------------------------------------------------------------------------ identities


def _same_type(m: Match) -> bool:
    return m.type("x").same_as(m.ctx.type(m.root.outputs[0]))


def _identity(name: str, op: str, unit: float) -> Rule:
    return Rule(name, Op(op, Any("x"), Const("c", lambda c, u=unit: c == u)), lambda m, b: m["x"], where=_same_type)


def _reshape_of_reshape(m: Match, b: Builder) -> str:
    return b.op("reshape", [m["x"]], name=m.root.outputs[0], shape=m.root.attrs["shape"])


RULES = [
    _identity("mul-by-one", "mul", 1.0),
    _identity("div-by-one", "div", 1.0),
    _identity("add-zero", "add", 0.0),
    _identity("sub-zero", "sub", 0.0),
    Rule("cast-to-own-dtype", Op("cast", Any("x")), lambda m, b: m["x"], where=_same_type),
    Rule("reshape-to-own-shape", Op("reshape", Any("x")), lambda m, b: m["x"], where=_same_type),
    Rule("reshape-of-reshape", Op("reshape", Op("reshape", Any("x"))), _reshape_of_reshape),
]


@register_pass("constant-fold")
def constant_fold(graph: Graph) -> Counter:
    """Fold weight-only and constant subgraphs into weights and constants; drop identities."""
    sites = fold_constants(graph)
    sites.update(apply_rules(graph, RULES))
    return sites
