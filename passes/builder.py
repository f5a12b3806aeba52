"""Building replacement nodes: typed by the op table, named fresh, placed before an anchor.

    b = Builder(graph, anchor=match.root)
    w = b.weight("mlp.gate_up", torch.cat([wg, wu]))
    y = b.op("gated_mlp", [x, w], act="situ", beta=4.0, linear_beta=25.0)
    b.commit()            # publish the new weights and types, insert the nodes before the anchor

Nothing reaches the graph before `commit`: a rewrite that gives up (returns None) leaves the
graph exactly as it was, weights and types included. New nodes inherit the anchor's source
location, so the IR still points at the model line. A node named after a value the rewrite
removes (`name=m.root.outputs[0]`) takes that value's name once it is gone.
"""

from __future__ import annotations

import itertools

import torch

from ..ir import OPS, Graph, Node, TensorType
from ..ir.ops import ShapeError


class Builder:
    def __init__(self, graph: Graph, anchor: Node):
        self.graph, self.anchor = graph, anchor
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}  # staged: published by commit
        self.weights: dict[str, torch.Tensor] = {}
        self.wanted: dict[str, str] = {}  # new value -> the name it was asked to have

    # ---- reading ---------------------------------------------------------------------
    def type(self, value: str) -> TensorType:
        return self.types[value] if value in self.types else self.graph.types[value]

    def tensor(self, value: str) -> torch.Tensor:
        """The data of a weight (a graph weight or one made by this builder)."""
        return self.weights[value] if value in self.weights else self.graph.weights[value]

    def is_weight(self, value: str) -> bool:
        return value in self.weights or value in self.graph.weights

    def fresh(self, base: str) -> str:
        """A value name used neither by the graph nor by this builder, starting with `base`."""
        base = base.replace("%", "")
        taken = lambda n: n in self.graph.types or n in self.types  # noqa: E731
        if not taken(base):
            return base
        name = next(f"{base}_{i}" for i in itertools.count(1) if not taken(f"{base}_{i}"))
        self.wanted[name] = base
        return name

    # ---- building --------------------------------------------------------------------
    def op(self, op: str, inputs: list[str], *, name: str | None = None, **attrs) -> str | list[str]:
        """Add a node; returns its output value (a list when the op has several)."""
        spec = OPS[op]
        problems = spec.attr_problems(attrs)
        if problems:  # a bug in a rewrite, never the user's: say which
            raise AssertionError(f"rewrite built {op} with bad attributes: {'; '.join(problems)}")
        try:
            types = spec.infer(*[self.type(i) for i in inputs], **spec.full_attrs(attrs))
        except ShapeError as e:
            raise AssertionError(f"rewrite built an ill-typed {op}: {e}") from None
        base = name or op
        named = len(spec.outputs) == len(types) and not any(o.endswith("*") for o in spec.outputs)
        outs = []
        for i, t in enumerate(types):
            out = self.fresh(base if len(types) == 1 else f"{base}.{spec.outputs[i] if named else i}")
            self.types[out] = t
            outs.append(out)
        self.nodes.append(Node(op, list(inputs), outs, dict(attrs), dict(self.anchor.meta)))
        return outs[0] if len(outs) == 1 else outs

    def const(self, value: float, dtype: str) -> str:
        return self.op("const", [], name="c", value=value, dtype=dtype)

    def cast(self, value: str, dtype: str) -> str:
        return value if self.type(value).dtype == dtype else self.op("cast", [value], name=f"{value}_{dtype}",
                                                                      dtype=dtype)

    def weight(self, name: str, tensor: torch.Tensor) -> str:
        """A new weight (named `name`, or `name_1`... when taken), added to the graph on commit."""
        value = self.fresh(name)
        self.weights[value] = tensor
        self.types[value] = TensorType.of(tensor)
        return value

    def commit(self) -> None:
        """Publish the staged weights and types and insert the new nodes, in order, just
        before the anchor."""
        self.graph.types.update(self.types)
        self.graph.weights.update(self.weights)
        at = next(i for i, n in enumerate(self.graph.nodes) if n is self.anchor)
        self.graph.nodes[at:at] = self.nodes
        self.nodes, self.types, self.weights = [], {}, {}
