"""The pattern language of the rewrite rules: match the subgraph that produced a value.

    silu_glu = Op("mul", Op("silu", Any("gate")), Any("up"))      # mul is tried both ways round
    scaled = Op("div", Any("x"), Const("c", lambda c: c != 0))    # a `const` node, predicate on its value
    Op("linear", maybe_cast(Op("rms_norm", Any("x"), Weight("n"))), Weight("w"), where=no_bias)
    Op("rms_norm", Any("x"), Opt(Weight("n")))                    # with or without its weight

A pattern matches a value; `Op` matches the node that produced it, with one sub-pattern per
input. Names capture: the same name twice must bind the same value (a `Const` name, the same
number). Commutative ops (the `commutative` family) are tried both ways; `Product` matches a
tree of `mul`s in any association and order. Matching backtracks, so alternatives are cheap
to write.

A match is only accepted when no work is duplicated: every matched node other than the root
must have all its users inside the match (and not be a graph output), because the rewrite
removes it. `const` nodes are leaves, shared freely.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..ir import OPS, Graph, Node, TensorType, family


@dataclass
class Context:
    """What matching needs to know about the graph: producers and users of every value."""

    graph: Graph
    producers: dict[str, Node]
    users: dict[str, list[Node]]

    @staticmethod
    def of(graph: Graph) -> Context:
        return Context(graph, graph.producers(), graph.users())

    def type(self, value: str) -> TensorType:
        return self.graph.types[value]


@dataclass
class _State:
    """Bindings of one partial match (copied on write so that backtracking is free)."""

    values: dict[str, str] = field(default_factory=dict)
    consts: dict[str, float] = field(default_factory=dict)
    nodes: tuple[Node, ...] = ()

    def bind(self, name: str | None, value: str) -> _State | None:
        if name is None:
            return self
        if name in self.values:
            return self if self.values[name] == value else None
        return _State({**self.values, name: value}, self.consts, self.nodes)

    def with_node(self, node: Node) -> _State:
        if any(n is node for n in self.nodes):
            return self
        return _State(self.values, self.consts, self.nodes + (node,))


@dataclass
class Match:
    """A successful match: the root node, the captured values and constants, the matched nodes."""

    root: Node
    values: dict[str, str]
    consts: dict[str, float]
    nodes: tuple[Node, ...]  # root first; the rewrite removes them once unused
    ctx: Context

    def __getitem__(self, name: str) -> str:
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def const(self, name: str) -> float:
        return self.consts[name]

    def type(self, name: str) -> TensorType:
        return self.ctx.type(self.values[name])

    def node(self, name: str) -> Node:
        """The node that produced the value captured as `name`."""
        return self.ctx.producers[self.values[name]]

    def users(self, name: str) -> list[Node]:
        """The nodes that read the value captured as `name` (inside the match or not)."""
        return list(self.ctx.users.get(self.values[name], ()))

    def single_use(self, name: str) -> bool:
        """The value captured as `name` has one reader and is no graph output (so a rewrite
        that folds it into that reader does not keep a second copy)."""
        v = self.values[name]
        return len(self.ctx.users.get(v, ())) == 1 and v not in self.ctx.graph.output_values

    def is_weight(self, name: str) -> bool:
        return self.ctx.graph.is_weight(self.values[name])

    def tensor(self, name: str):
        """The data of the weight captured as `name`."""
        return self.ctx.graph.weights[self.values[name]]


class Pattern:
    def match(self, value: str, ctx: Context, st: _State) -> Iterator[_State]:
        raise NotImplementedError


@dataclass
class Any(Pattern):
    """Any value; `where(type)` may restrict it."""

    name: str | None = None
    where: Callable[[TensorType], bool] | None = None

    def match(self, value, ctx, st):
        if self.where is None or self.where(ctx.type(value)):
            nst = st.bind(self.name, value)
            if nst is not None:
                yield nst


@dataclass
class Weight(Pattern):
    """A graph weight (a value with data and no producer)."""

    name: str | None = None

    def match(self, value, ctx, st):
        if ctx.graph.is_weight(value):
            nst = st.bind(self.name, value)
            if nst is not None:
                yield nst


@dataclass
class Const(Pattern):
    """The output of a `const` node; `where(number)` may restrict its value."""

    name: str | None = None
    where: Callable[[float], bool] | None = None

    def match(self, value, ctx, st):
        node = ctx.producers.get(value)
        if node is None or node.op != "const":
            return
        number = node.attrs["value"]
        if self.where is not None and not self.where(number):
            return
        if self.name is not None:
            if self.name in st.consts:
                if st.consts[self.name] != number:
                    return
            else:
                st = _State({**st.values, self.name: value}, {**st.consts, self.name: number}, st.nodes)
        yield st


class Op(Pattern):
    """The node of op `op` (a name or a set of names) that produced the value.

    `inputs`: one pattern per input (None: any inputs); `where(attrs)`: a predicate on the
    node's attributes (defaults filled in); `output`: which output of the node the value is.
    """

    def __init__(self, op: str | frozenset[str] | set[str], *inputs: Pattern, name: str | None = None,
                 where: Callable[[dict], bool] | None = None, output: int = 0, any_inputs: bool = False):
        self.ops = frozenset([op]) if isinstance(op, str) else frozenset(op)
        self.inputs = None if any_inputs else inputs
        self.name, self.where, self.output = name, where, output

    def __repr__(self) -> str:
        ops = "|".join(sorted(self.ops))
        return f"Op({ops}, {', '.join(map(repr, self.inputs or ()))})"

    def match(self, value, ctx, st):
        node = ctx.producers.get(value)
        if node is None or node.op not in self.ops or node.outputs.index(value) != self.output:
            return
        yield from self.match_node(node, ctx, st.bind(self.name, value))

    def match_node(self, node: Node, ctx: Context, st: _State | None) -> Iterator[_State]:
        if st is None:
            return
        if self.where is not None and not self.where(OPS[node.op].full_attrs(node.attrs)):
            return
        st = st.with_node(node)
        if self.inputs is None:
            yield st
            return
        n = len(node.inputs)
        required = len(self.inputs) - sum(isinstance(p, Opt) for p in self.inputs[n:])
        if n > len(self.inputs) or required != n:  # trailing inputs the node lacks must be Opt
            return
        pats = self.inputs[:n]
        orders = [node.inputs]
        if n == 2 and node.op in family("commutative") and node.inputs[0] != node.inputs[1]:
            orders.append(node.inputs[::-1])
        for inputs in orders:
            yield from _match_all(list(zip(pats, inputs)), ctx, st)


def _match_all(pairs: list[tuple[Pattern, str]], ctx: Context, st: _State) -> Iterator[_State]:
    if not pairs:
        yield st
        return
    (pat, value), rest = pairs[0], pairs[1:]
    for nst in pat.match(value, ctx, st):
        yield from _match_all(rest, ctx, nst)


@dataclass
class Opt(Pattern):
    """An optional trailing input of an `Op`: matches `pattern` when the node has the input,
    and matches its absence (`name in match` then says which)."""

    pattern: Pattern

    def match(self, value, ctx, st):
        yield from self.pattern.match(value, ctx, st)


@dataclass
class Alt(Pattern):
    """The first of `patterns` that matches (the others are tried on backtracking)."""

    patterns: tuple[Pattern, ...]

    def __init__(self, *patterns: Pattern):
        self.patterns = patterns

    def match(self, value, ctx, st):
        for p in self.patterns:
            yield from p.match(value, ctx, st)


def maybe_cast(p: Pattern, name: str | None = None) -> Pattern:
    """`p`, or a `cast` of it (tried first)."""
    return Alt(Op("cast", p, name=name), p)


class Product(Pattern):
    """A product of `factors` as any tree of `mul`s, in any order and association.

    x * c * y, (x * y) * c and c * (y * x) all match Product(X, C, Y).
    """

    ops = frozenset({"mul"})
    output = 0

    def __init__(self, *factors: Pattern, name: str | None = None):
        self.factors, self.name = factors, name

    def match(self, value, ctx, st):
        st = st.bind(self.name, value)
        if st is None:
            return
        for leaves, nodes in _mul_trees(value, ctx, len(self.factors), top=True):
            sub = st
            for n in nodes:
                sub = sub.with_node(n)
            for perm in itertools.permutations(leaves):
                yield from _match_all(list(zip(self.factors, perm)), ctx, sub)


def _mul_trees(value: str, ctx: Context, n: int, top: bool = False) -> Iterator[tuple[list[str], list[Node]]]:
    """Every way to read `value` as a product of exactly `n` leaves through `mul` nodes."""
    node = ctx.producers.get(value)
    if not top and n == 1:
        yield [value], []
    if node is None or node.op != "mul" or n < 2:
        return
    a, b = node.inputs
    for k in range(1, n):
        for la, na in _mul_trees(a, ctx, k):
            for lb, nb in _mul_trees(b, ctx, n - k):
                yield la + lb, [node] + na + nb


def match(pattern: Op | Product, node: Node, ctx: Context) -> Match | None:
    """The first match of `pattern` rooted at `node` that duplicates no work, or None."""
    if node.op not in pattern.ops or pattern.output >= len(node.outputs):
        return None
    for st in pattern.match(node.outputs[pattern.output], ctx, _State()):
        if _single_use(node, st.nodes, ctx):
            return Match(node, st.values, st.consts, st.nodes, ctx)
    return None


def _single_use(root: Node, nodes: tuple[Node, ...], ctx: Context) -> bool:
    inside = {id(n) for n in nodes}
    outputs = set(ctx.graph.output_values)
    for n in nodes:
        if n is root:
            continue
        for o in n.outputs:
            if o in outputs or any(id(u) not in inside for u in ctx.users.get(o, ())):
                return False
    return True
