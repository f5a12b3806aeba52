"""How the Triton codegen groups IR nodes into kernels: a plan of steps in graph order.

    Single(node)          one node, lowered by the `triton` table (a template or torch)
    Group(nodes)          a tree of elementwise nodes -> one generated kernel (elementwise.py)

Fusions with a pattern of their own (the gated RMSNorm, l2norm) are IR passes (fuse-norms),
not decisions of this planner; it only groups elementwise neighbours.

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


Step = Single | Group


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

    for node in reversed(graph.nodes):  # elementwise groups, grown from the last node back
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
    return step.root


def _read_outside_groups(node: Node, users: dict, taken: dict) -> bool:
    """Whether a node that is no fused step reads the constant (fused steps inline it)."""
    return any(id(u) not in taken for u in users.get(node.outputs[0], []))
