"""How the Triton codegen groups IR nodes into kernels: a plan of steps in graph order.

    Single(node)          one node, lowered by the table in lowering.py (a template or torch)
    GatedNorm(nodes)      rms_norm(x, w) * sigmoid(gate) -> one gated RMSNorm kernel
    L2Norm(nodes)         x * rsqrt(sum(x^2, -1) + eps) -> one row-norm kernel
    Group(nodes)          a tree of elementwise nodes -> one generated kernel (elementwise.py)

Groups grow backwards from a root: a producer joins when it is elementwise and every user
of its result is already in the group (so nothing outside needs the intermediate), its
result is no graph output, and it is no `const` (constants are inlined as literals into
every group that reads them). A producer of a smaller, broadcast shape may join: it is then
recomputed per element of the result, which costs less than a launch and a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import Graph, Node
from .elementwise import Group, const_value, fusible


@dataclass
class Single:
    node: Node


@dataclass
class GatedNorm:
    norm: Node  # rms_norm(x, w)
    sigmoid: Node  # sigmoid(gate)
    mul: Node  # the product: the step's result

    @property
    def nodes(self) -> list[Node]:
        return [self.norm, self.sigmoid, self.mul]


@dataclass
class L2Norm:
    x: str  # the normalised value
    eps: float
    nodes: list[Node]  # pow, reduce_sum, add, rsqrt, mul: the last is the step's result

    @property
    def mul(self) -> Node:
        return self.nodes[-1]


Step = Single | GatedNorm | L2Norm | Group


def constants(graph: Graph) -> dict[str, float]:
    """Values of the floating `const` nodes, by value name."""
    return {n.outputs[0]: v for n in graph.nodes if (v := const_value(n)) is not None}


def plan(graph: Graph) -> list[Step]:
    """The steps of `graph` in an order that respects every dependence."""
    users = graph.users()
    producer = graph.producers()
    outputs = set(graph.output_values)
    consts = constants(graph)
    taken: dict[int, Step] = {}  # id(node) -> its step

    def private(value: str, step_nodes: set[int]) -> bool:
        """Only nodes of the step read `value`, and the graph does not return it."""
        return value not in outputs and all(id(u) in step_nodes for u in users.get(value, []))

    for node in reversed(graph.nodes):  # patterns first: the gated norm, l2norm
        if id(node) in taken or node.op != "mul":
            continue
        step = _gated_norm(node, producer, graph, private) or _l2norm(node, producer, graph, consts, private)
        if step is not None:
            for n in step.nodes:
                taken[id(n)] = step

    for node in reversed(graph.nodes):  # then elementwise groups, grown from the last node back
        if id(node) in taken or node.op == "const" or not fusible(node, graph, consts):
            continue
        if graph.types[node.outputs[0]].dtype == "bool":
            continue
        members = {id(node): node}
        grew = True
        while grew:
            grew = False
            for m in list(members.values()):
                for v in m.inputs:
                    p = producer.get(v)
                    if (p is None or id(p) in members or id(p) in taken or p.op == "const"
                            or not fusible(p, graph, consts) or not private(v, set(members))):
                        continue
                    members[id(p)] = p
                    grew = True
        order = [n for n in graph.nodes if id(n) in members]
        inside = {o for n in order for o in n.outputs}
        inputs: list[str] = []
        for n in order:
            for v in n.inputs:
                if v not in inside and v not in consts and v not in inputs:
                    inputs.append(v)
        group = Group(order, inputs)
        for n in order:
            taken[id(n)] = group

    steps: list[Step] = []
    emitted: set[int] = set()
    for node in graph.nodes:
        step = taken.get(id(node))
        if step is None:
            if node.op == "const" and node.outputs[0] in consts and not _read_outside_groups(node, users, taken):
                continue  # inlined as a literal wherever it is read
            steps.append(Single(node))
        elif _result(step) is node and id(step) not in emitted:  # a fused step runs where its result is made
            steps.append(step)
            emitted.add(id(step))
    return steps


def _result(step: Step) -> Node:
    return step.mul if isinstance(step, (GatedNorm, L2Norm)) else step.root


def _read_outside_groups(node: Node, users: dict, taken: dict) -> bool:
    """Whether a node that is no fused step reads the constant (fused steps inline it)."""
    return any(id(u) not in taken for u in users.get(node.outputs[0], []))


def _gated_norm(mul: Node, producer: dict, graph: Graph, private) -> GatedNorm | None:
    """mul(rms_norm(x, w), sigmoid(gate)) in either operand order, x and gate of one shape."""
    if len(mul.inputs) != 2:
        return None
    a, b = (producer.get(v) for v in mul.inputs)
    if a is not None and b is not None and a.op == "sigmoid":
        a, b = b, a
    if a is None or b is None or a.op != "rms_norm" or b.op != "sigmoid" or len(a.inputs) != 2:
        return None
    x, gate = graph.types[a.inputs[0]], graph.types[b.inputs[0]]
    if not x.same_as(gate) or not graph.types[mul.outputs[0]].same_as(x):
        return None
    nodes = {id(mul), id(a), id(b)}
    if not (private(a.outputs[0], nodes) and private(b.outputs[0], nodes)):
        return None
    return GatedNorm(a, b, mul)


def _l2norm(mul: Node, producer: dict, graph: Graph, consts: dict, private) -> L2Norm | None:
    """mul(x, rsqrt(add(reduce_sum(pow(x, 2), [-1], keepdim), eps))), operands in either order."""
    for x, r in (mul.inputs, reversed(mul.inputs)):
        rsqrt = producer.get(r)
        add = producer.get(rsqrt.inputs[0]) if rsqrt is not None and rsqrt.op == "rsqrt" else None
        if add is None or add.op != "add":
            continue
        total, eps = add.inputs if add.inputs[1] in consts else tuple(reversed(add.inputs))
        red = producer.get(total)
        if eps not in consts or red is None or red.op != "reduce_sum" or not red.attrs.get("keepdim"):
            continue
        rank = graph.types[x].rank
        sq = producer.get(red.inputs[0])
        if ([d % rank for d in red.attrs["dims"]] != [rank - 1] or sq is None or sq.op != "pow"
                or sq.inputs[0] != x or consts.get(sq.inputs[1]) != 2.0):
            continue
        nodes = [sq, red, add, rsqrt, mul]
        ids = {id(n) for n in nodes}
        if all(private(n.outputs[0], ids) for n in nodes[:-1]) and graph.types[mul.outputs[0]].same_as(graph.types[x]):
            return L2Norm(x, consts[eps], nodes)
    return None
