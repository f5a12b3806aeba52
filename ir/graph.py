"""The k3c IR: a graph of nodes `(op, inputs, attrs, outputs)` over typed values.

Plain data. Every value has a name and a `TensorType`; graph inputs and weights are values
without a producer. Weight data is held by name in `graph.weights`, outside the text form.
Node order is a valid topological order (the verifier checks it).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from .types import TensorType


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # "loc": "file.py:line", "stack_trace"

    @property
    def loc(self) -> str | None:
        return self.meta.get("loc")

    def describe(self) -> str:
        outs = ", ".join("%" + o for o in self.outputs)
        ins = ", ".join("%" + i for i in self.inputs)
        where = f" (at {self.loc})" if self.loc else ""
        return f"{outs} = {self.op}({ins}){where}"


@dataclass
class Graph:
    name: str = "graph"
    dims: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # name -> [lo, hi]
    inputs: list[str] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (output name, value)
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- queries -------------------------------------------------------------------
    @property
    def weight_names(self) -> list[str]:
        return list(self.weights)

    @property
    def output_values(self) -> list[str]:
        return [v for _, v in self.outputs]

    def symbols(self) -> dict[str, sympy.Symbol]:
        return {n: sympy.Symbol(n, integer=True, positive=True) for n in self.dims}

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {v: [] for v in self.types}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def is_weight(self, name: str) -> bool:
        return name in self.weights

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))

    # ---- edits ---------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        """A value name not used yet, starting with `prefix`."""
        prefix = prefix.replace("%", "")
        if prefix not in self.types:
            return prefix
        for i in itertools.count(1):
            name = f"{prefix}_{i}"
            if name not in self.types:
                return name
        raise AssertionError("unreachable")

    def add_weight(self, name: str, tensor: torch.Tensor) -> str:
        name = self.fresh(name)
        self.weights[name] = tensor
        self.types[name] = TensorType.of(tensor)
        return name

    def replace_uses(self, old: str, new: str) -> None:
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        self.outputs = [(k, new if v == old else v) for k, v in self.outputs]

    def prune_types(self) -> None:
        """Forget the types of values no node, input, weight or output refers to."""
        live = set(self.inputs) | set(self.weights) | set(self.output_values)
        for n in self.nodes:
            live.update(n.inputs)
            live.update(n.outputs)
        self.types = {k: v for k, v in self.types.items() if k in live}
        self.weights = {k: v for k, v in self.weights.items() if k in live}

    def copy(self) -> Graph:
        """A deep copy of the structure; weight tensors are shared, not copied."""
        g = Graph(self.name, dict(self.dims), list(self.inputs), dict(self.weights), dict(self.types),
                  [Node(n.op, list(n.inputs), list(n.outputs), copy.deepcopy(n.attrs), dict(n.meta))
                   for n in self.nodes],
                  list(self.outputs), copy.deepcopy({k: v for k, v in self.meta.items()}))
        return g

    def structurally_equal(self, other: Graph) -> bool:
        """Same dims, inputs, weight names and types, nodes (op, io, attrs, loc) and outputs."""
        def key(g: Graph):
            return (g.name, g.dims, g.inputs, sorted((k, str(t)) for k, t in g.types.items()),
                    sorted(g.weight_names),
                    [(n.op, n.inputs, n.outputs, _attr_key(n.attrs), n.loc) for n in g.nodes],
                    g.outputs)
        return key(self) == key(other)

    def __str__(self) -> str:
        from .text import print_graph

        return print_graph(self)


def _attr_key(attrs: dict) -> list:
    return sorted((k, repr(v)) for k, v in attrs.items())
