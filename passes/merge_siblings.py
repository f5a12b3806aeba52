"""Sibling linears: the linears that read one input become one GEMM over their concatenated
weights and a `split` (router logits and the latent down-projection; MLA's q_a_proj,
kv_a_proj_with_mqa and gate; KDA's projections). A group rewrite, part of fold-latent-moe:
unlike a `Rule` it replaces several roots at once, so it groups the nodes itself.
"""

from __future__ import annotations

import torch

from ..ir import Graph, Node
from . import cost as C
from .builder import Builder
from .driver import remove_dead, replace_outputs


def _weight_part(name: str, prefix_len: int) -> str:
    parts = name.split(".")
    if parts[-1] == "weight":
        parts = parts[:-1]
    return ".".join(parts[prefix_len:]) or parts[-1]


def merged_name(names: list[str]) -> str:
    """a.b.q_proj.weight, a.b.k_proj.weight -> a.b.q_proj-k_proj.weight"""
    split = [n.split(".") for n in names]
    prefix = 0
    while all(len(s) > prefix + 1 and s[prefix] == split[0][prefix] for s in split):
        prefix += 1
    head = ".".join(split[0][:prefix])
    body = "-".join(_weight_part(n, prefix) for n in names)
    return f"{head}.{body}.weight" if head else f"{body}.weight"


def sibling_groups(graph: Graph) -> list[list[Node]]:
    """Linears without bias that read one input, each with a weight of its own, of one dtype
    and in-width: the groups worth merging (two or more)."""
    users = graph.users()
    groups: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if n.op != "linear" or len(n.inputs) != 2 or not graph.is_weight(n.inputs[1]):
            continue
        if len(users[n.inputs[1]]) != 1 or n.inputs[1] in graph.output_values:
            continue  # a shared weight would be stored twice
        key = (n.inputs[0], graph.types[n.inputs[1]].dtype, graph.types[n.inputs[1]].shape[1])
        groups.setdefault(key, []).append(n)
    return [g for g in groups.values() if len(g) > 1]


def merge_sibling_linears(graph: Graph) -> int:
    """Merge every group the cost model does not object to; returns the groups merged."""
    sites = 0
    for members in sibling_groups(graph):
        x = members[0].inputs[0]
        weights = [graph.weights[n.inputs[1]] for n in members]
        b = Builder(graph, members[0])
        w = b.weight(merged_name([n.inputs[1] for n in members]), torch.cat(weights, 0))
        y = b.op("linear", [x, w], name=members[0].outputs[0] + "_merged")
        parts = b.op("split", [y], name=y, dim=graph.types[x].rank - 1, sizes=[int(t.shape[0]) for t in weights])
        if not C.no_worse(C.nodes_cost(graph, members), C.staged_cost(b)):
            continue
        b.commit()
        for n, p in zip(members, parts):
            replace_outputs(graph, n, [p])
        remove_dead(graph, members)
        sites += 1
    return sites
