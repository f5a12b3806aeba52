"""The pass manager: the pass registry, the rewrite driver, the pipeline runner, the report.

A pass is a function `fn(graph, **options) -> {rule name: sites}` that edits `graph` in
place; `register_pass` names it. Most passes are a list of `Rule`s handed to
`apply_rules`, which rewrites to a fixed point. A pipeline is a flat list of pass names,
each optionally with options: "chunk-delta-rule{chunk_size=32}".
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import Graph, Node, VerifyError, verify
from ..ir.text import parse_value, split_top
from . import cost as C
from .builder import Builder
from .pattern import Context, Match, Op, Product, match

# ------------------------------------------------------------------------- rules


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
    """Rewrite `graph` in place until no rule matches; returns sites rewritten per rule."""
    sites: Counter = Counter()
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
                created = list(b.nodes)
                b.commit()
                values = [result] if isinstance(result, str) else list(result)
                replace_outputs(graph, node, values)
                removed |= remove_dead(graph, m.nodes)
                _keep_names(graph, m.nodes, values, created)
                sites[rule.name] += 1
                changed = True
                ctx = Context.of(graph)
                break
        if not changed:
            return sites
    raise RuntimeError(f"rules {[r.name for r in rules]} did not reach a fixed point in {max_sweeps} sweeps")


def _keep_names(graph: Graph, matched, values: list[str], created: list[Node]) -> None:
    """A value rebuilt keeps its old name (the IR diff shows only what changed): the root's
    replacement by the same op, and a new node the rewrite named after a removed one."""
    root = matched[0]
    made = {o: n for n in created for o in n.outputs}
    pairs = [(before, after) for before, after in zip(root.outputs, values)
             if after in made and made[after].op == root.op]
    gone = {o for n in matched for o in n.outputs if o not in graph.types}
    for n in created:
        base, _, number = n.outputs[0].rpartition("_")
        if len(n.outputs) == 1 and number.isdigit():  # a fresh name: `base` was taken when it was made
            if base in gone:
                pairs.append((base, n.outputs[0]))
    for before, after in pairs:
        if before not in graph.types and after in graph.types:
            rename_value(graph, after, before)


def rename_value(graph: Graph, old: str, new: str) -> None:
    graph.types[new] = graph.types.pop(old)
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
    """Remove the candidate nodes (and `const` nodes) that nothing uses any more; returns their ids."""
    cand = {id(n) for n in candidates}
    uses = Counter(i for n in graph.nodes for i in n.inputs)
    uses.update(graph.output_values)
    removed: set[int] = set()
    for n in reversed(graph.nodes):  # consumers first: a removed user frees its producers
        if (id(n) in cand or n.op == "const") and not any(uses[o] for o in n.outputs):
            removed.add(id(n))
            uses.subtract(n.inputs)
            for o in n.outputs:
                graph.types.pop(o, None)
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


# ---------------------------------------------------------------------- registry


@dataclass
class Pass:
    name: str
    fn: Callable[..., Counter | dict]
    doc: str
    options: dict = field(default_factory=dict)  # name -> default


PASSES: dict[str, Pass] = {}


def register_pass(name: str, **options):
    """Decorator: register `fn(graph, **options) -> {rule: sites}` as pass `name`."""

    def deco(fn):
        if name in PASSES:
            raise ValueError(f"pass {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        PASSES[name] = Pass(name, fn, doc[0] if doc else "", dict(options))
        return fn

    return deco


def rule_pass(name: str, rules: list[Rule], doc: str) -> Pass:
    """Register a pass that is just `rules` applied to a fixed point."""

    def fn(graph: Graph) -> Counter:
        return apply_rules(graph, rules)

    fn.__doc__ = doc
    register_pass(name)(fn)
    return PASSES[name]


def parse_step(step: str | tuple[str, dict]) -> tuple[str, dict]:
    """"name" or "name{k=v, ...}" or (name, {k: v}) -> (name, options), checked."""
    if isinstance(step, tuple):
        name, opts = step[0], dict(step[1])
    else:
        m = re.fullmatch(r"\s*([\w\-]+)\s*(?:\{(.*)\})?\s*", step)
        if not m:
            raise ValueError(f"malformed pass {step!r} (expected 'name' or 'name{{key=value, ...}}')")
        name, opts = m.group(1), {}
        for item in split_top(m.group(2) or ""):
            k, eq, v = item.partition("=")
            if not eq:
                raise ValueError(f"malformed pass option {item!r} in {step!r} (expected key=value)")
            opts[k.strip()] = parse_value(v, {})
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; known: {', '.join(sorted(PASSES))}")
    bad = sorted(set(opts) - set(PASSES[name].options))
    if bad:
        known = ", ".join(PASSES[name].options) or "none"
        raise ValueError(f"pass {name!r} has no option(s) {bad}; its options: {known}")
    return name, opts


# ------------------------------------------------------------------------ report


@dataclass
class PassReport:
    """What one pass changed: sites per rule, node count, estimated cost, time."""

    name: str
    graph: str
    sites: dict[str, int]
    nodes_before: int
    nodes_after: int
    flops_before: int
    flops_after: int
    bytes_before: int
    bytes_after: int
    seconds: float

    @property
    def total_sites(self) -> int:
        return sum(self.sites.values())

    def __str__(self) -> str:
        rules = ", ".join(f"{k} {v}" for k, v in self.sites.items()) or "no change"
        return (f"{self.name:<20} {self.total_sites:>4} sites  nodes {self.nodes_before:>5} -> {self.nodes_after:<5}"
                f" GFLOP {self.flops_before / 1e9:9.3f} -> {self.flops_after / 1e9:<9.3f}"
                f" MB {self.bytes_before / 1e6:9.1f} -> {self.bytes_after / 1e6:<9.1f}"
                f" {self.seconds * 1e3:7.1f} ms  ({rules})")


def format_report(entries: list[PassReport]) -> str:
    at = ", ".join(f"{k}={v}" for k, v in C.COST_AT.items())
    lines = [f"pass report (cost estimated at {at})"]
    for graph in dict.fromkeys(e.graph for e in entries):
        lines.append(f"{graph}:")
        lines.extend("  " + str(e) for e in entries if e.graph == graph)
    return "\n".join(lines)


# ----------------------------------------------------------------------- pipeline


class PassVerifyError(VerifyError):
    """A pass produced a graph the verifier rejects (a bug in the pass): names the pass."""

    def __init__(self, pass_name: str, err: VerifyError):
        Exception.__init__(self, f"after pass {pass_name!r}: {err}")
        self.rule, self.node, self.pass_name = err.rule, err.node, pass_name


def check_steps(steps: list, stop_after: str | None = None, dump_after: str | None = None) -> list[tuple[str, dict]]:
    """Parse and check a pipeline's steps before anything runs; a ValueError says what is wrong."""
    parsed = [parse_step(s) for s in steps]
    names = [n for n, _ in parsed]
    for what, want in (("stop_after", stop_after), ("dump_after", dump_after)):
        if want is not None and want not in names:
            raise ValueError(f"{what}: pass {want!r} is not in the pipeline ({', '.join(names) or 'empty'})")
    return parsed


def run_pipeline(graph: Graph, steps: list, *, verify_each: bool = True, stop_after: str | None = None,
                 dump_after: str | None = None, report: list | None = None, out=None) -> Graph:
    parsed = check_steps(steps, stop_after, dump_after)
    g = graph.copy()
    if verify_each:
        verify(g)
    before = C.graph_cost(g) if report is not None else None
    for name, opts in parsed:
        nodes_before = len(g.nodes)
        t0 = time.perf_counter()
        sites = PASSES[name].fn(g, **opts) or {}
        drop_unused_weights(g)
        g.prune_types()
        seconds = time.perf_counter() - t0
        if verify_each:
            try:
                verify(g)
            except VerifyError as e:
                raise PassVerifyError(name, e) from None
        if report is not None:
            after = C.graph_cost(g)
            report.append(PassReport(name, g.name, dict(sites), nodes_before, len(g.nodes), before.flops, after.flops,
                                     before.bytes, after.bytes, seconds))
            before = after
        if dump_after == name:
            print(f"// IR after {name}", file=out or sys.stdout)
            print(g, end="", file=out or sys.stdout)
        if stop_after == name:
            break
    return g
