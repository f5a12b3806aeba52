"""Building replacement nodes: typed by the op table, named fresh, placed before an anchor.

    b = Builder(graph, anchor=match.root)
    w = b.weight("mlp.gate_up", torch.cat([wg, wu]))
    y = b.op("gated_mlp", [x, w], act="situ", beta=4.0, linear_beta=25.0)
    b.commit()            # insert the new nodes just before the anchor

New nodes inherit the anchor's source location, so the IR still points at the model line.
"""

from __future__ import annotations

import torch

from ..ir import OPS, Graph, Node, TensorType
from ..ir.ops import ShapeError


class Builder:
    def __init__(self, graph: Graph, anchor: Node):
        self.graph, self.anchor = graph, anchor
        self.nodes: list[Node] = []

    def type(self, value: str) -> TensorType:
        return self.graph.types[value]

    def op(self, op: str, inputs: list[str], *, name: str | None = None, **attrs) -> str | list[str]:
        """Add a node; returns its output value (a list when the op has several)."""
        spec = OPS[op]
        try:
            types = spec.infer(*[self.graph.types[i] for i in inputs], **spec.full_attrs(attrs))
        except ShapeError as e:  # a bug in a rewrite, never the user's: say which
            raise AssertionError(f"rewrite built an ill-typed {op}: {e}") from None
        base = name or op
        named = len(spec.outputs) == len(types) and not any(o.endswith("*") for o in spec.outputs)
        outs = []
        for i, t in enumerate(types):
            out = self.graph.fresh(base if len(types) == 1 else f"{base}.{spec.outputs[i] if named else i}")
            self.graph.types[out] = t
            outs.append(out)
        self.nodes.append(Node(op, list(inputs), outs, dict(attrs), dict(self.anchor.meta)))
        return outs[0] if len(outs) == 1 else outs

    def const(self, value: float, dtype: str) -> str:
        return self.op("const", [], name="c", value=value, dtype=dtype)

    def cast(self, value: str, dtype: str) -> str:
        return value if self.type(value).dtype == dtype else self.op("cast", [value], name=f"{value}_{dtype}",
                                                                      dtype=dtype)

    def weight(self, name: str, tensor: torch.Tensor) -> str:
        """A new graph weight (named `name`, or `name_1`... when taken)."""
        return self.graph.add_weight(name, tensor)

    def commit(self) -> None:
        """Insert the new nodes, in order, just before the anchor."""
        at = next(i for i, n in enumerate(self.graph.nodes) if n is self.anchor)
        self.graph.nodes[at:at] = self.nodes
        self.nodes = []
