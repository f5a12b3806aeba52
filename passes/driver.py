"""The rewrite driver: rules applied to a fixed point, and the graph edits they share.

    sites = apply_rules(graph, [rule, ...])      # edits graph in place; {rule name: sites}

A `Rule` is a pattern and a rewrite; the driver tries the rules at every node, consumers
first, and where one matches it builds the replacement with a transactional `Builder`,
rewires the root's users, removes what became dead and keeps old value names where a
value was rebuilt. A rewrite that returns None changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import RewriteError
from ..ir import Graph, Node
from .builder import Builder
from .pattern import Context, Match, Op, Product, match


@dataclass
class Rule:
    """A named rewrite: where `pattern` matches (and `where(match)` holds), `rewrite` builds
    the replacement with the builder and returns the values that replace the root's outputs
    (one value, or a list for a multi-output root), or None to leave the site alone."""

    name: str
    pattern: Op | Product
    rewrite: Callable[[Match, Builder], str | list[str] | None]
    where: Callable[[Match], bool] | None = None


def apply_rules(graph: Graph, rules: list[Rule], max_sweeps: int = 50) -> Counter:
    """Rewrite `graph` in place until no rule matches; returns sites rewritten per rule.

    A rule that matches what it builds (`relu -> relu(relu)`) would never stop, and may double
    the graph each sweep: past `REWRITES_PER_NODE` rewrites per node of the graph as given, or
    a graph grown `GROWTH` times, a RewriteError names the rule that fired most."""
    sites: Counter = Counter()
    budget = REWRITES_PER_NODE * len(graph.nodes) + 64
    limit = GROWTH * len(graph.nodes) + 256
    by_op: dict[str, list[Rule]] = {}
    for r in rules:
        for op in r.pattern.ops:
            by_op.setdefault(op, []).append(r)
    for _ in range(max_sweeps):
        changed = False
        ctx = Context.of(graph)
        removed: set[int] = set()
        # consumers first: a rule rooted at a later node sees the largest subgraph (a
        # product of five factors is not taken as one of four times a fifth)
        for node in reversed(list(graph.nodes)):
            if id(node) in removed:
                continue
            for rule in by_op.get(node.op, ()):
                m = match(rule.pattern, node, ctx)
                if m is None or (rule.where is not None and not rule.where(m)):
                    continue
                b = Builder(graph, node)
                result = rule.rewrite(m, b)
                if result is None:
                    continue
                removed |= replace(graph, node, b, [result] if isinstance(result, str) else list(result), m.nodes)
                sites[rule.name] += 1
                changed = True
                if sum(sites.values()) > budget or len(graph.nodes) > limit:
                    _runaway(sites, graph, budget)
                ctx = Context.of(graph)
                break
        if not changed:
            return sites
    _runaway(sites, graph, budget, f"{max_sweeps} sweeps")


REWRITES_PER_NODE = 16
GROWTH = 8


def _runaway(sites: Counter, graph: Graph, budget: int, after: str | None = None) -> None:
    rule, n = sites.most_common(1)[0]
    raise RewriteError(f"rule {rule!r} does not reach a fixed point: {n} rewrites "
                       f"({sum(sites.values())} in all, {after or f'budget {budget}'}), the graph now "
                       f"{len(graph.nodes)} nodes; does its rewrite build what its pattern matches?")


def replace(graph: Graph, root: Node, b: Builder, values: list[str], matched=()) -> set[int]:
    """Commit `b` and make `values` replace `root`'s outputs; remove the matched nodes (root
    included) that nothing reads any more; returns the ids of the removed nodes."""
    created = list(b.nodes)
    wanted = dict(b.wanted)
    b.commit()
    replace_outputs(graph, root, values)
    matched = list(matched) or [root]
    gone_names = {o for n in matched for o in n.outputs}
    removed = remove_dead(graph, matched)
    gone_names = {o for o in gone_names if o not in graph.types}
    _keep_names(graph, root, values, created, wanted, gone_names)
    return removed


def _keep_names(graph: Graph, root: Node, values: list[str], created: list[Node], wanted: dict[str, str],
                gone: set[str]) -> None:
    """A value rebuilt keeps its old name (the IR diff shows only what changed): the root's
    replacement by the same op, and a new value asked to be named after a removed one."""
    made = {o: n for n in created for o in n.outputs}
    pairs = [(before, after) for before, after in zip(root.outputs, values)
             if after in made and made[after].op == root.op]
    pairs += [(want, new) for new, want in wanted.items() if want in gone]
    for before, after in pairs:
        if before not in graph.types and after in graph.types:
            rename_value(graph, after, before)


def rename_value(graph: Graph, old: str, new: str) -> None:
    graph.types[new] = graph.types.pop(old)
    if old in graph.weights:
        graph.weights[new] = graph.weights.pop(old)
    for n in graph.nodes:
        n.outputs = [new if o == old else o for o in n.outputs]
    graph.replace_uses(old, new)


def replace_outputs(graph: Graph, node: Node, values: list[str]) -> None:
    if len(values) != len(node.outputs):
        raise AssertionError(f"a rewrite of {node.op} returned {len(values)} values for {len(node.outputs)} outputs")
    for old, new in zip(node.outputs, values):
        if old != new:
            graph.replace_uses(old, new)


def remove_dead(graph: Graph, candidates) -> set[int]:
    """Remove the candidate nodes that nothing uses any more, and the `const` nodes and
    weights only they read; returns the ids of the removed nodes."""
    cand = {id(n) for n in candidates}
    uses = Counter(i for n in graph.nodes for i in n.inputs)
    uses.update(graph.output_values)
    producers = {o: n for n in graph.nodes for o in n.outputs}
    removed: set[int] = set()
    for n in reversed(graph.nodes):  # consumers first: a removed user frees its producers
        if id(n) in cand and not any(uses[o] for o in n.outputs):
            removed.add(id(n))
            uses.subtract(n.inputs)
            for o in n.outputs:
                graph.types.pop(o, None)
            for i in n.inputs:  # a constant or weight that fed only removed nodes goes with them
                p = producers.get(i)
                if p is not None and p.op == "const":
                    cand.add(id(p))
                elif i in graph.weights and not uses[i]:
                    del graph.weights[i]
                    graph.types.pop(i, None)
    if removed:
        graph.nodes = [n for n in graph.nodes if id(n) not in removed]
    return removed


def drop_unused_weights(graph: Graph) -> int:
    """Forget the weights no node reads and no output names (a rewrite that replaced a
    weight leaves the old one behind); returns how many went."""
    used = set(graph.output_values)
    for n in graph.nodes:
        used.update(n.inputs)
    dead = [w for w in graph.weights if w not in used]
    for w in dead:
        del graph.weights[w]
        del graph.types[w]
    return len(dead)
