"""IR graph -> ONNX ModelProto: the driver that walks the nodes and asks the tables.

    model, report = lower_graph(graph, flavour="portable")     # or "ort"

Inputs keep their IR names; an output whose name is also an input's (a decode graph's new
state) is called `present.<name>`. Weights become initializers (a weight W [out, in] read
by `linear` is stored as W^T). Symbolic dims become dim_params ("B", "P + 1") on the graph
inputs and outputs and are computed from input shapes where a node needs their value.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import onnx
import sympy
import torch
from onnx import helper as oh

from ...ir import OPS, Graph, Node, named_inputs
from .. import FLAVOURS as BACKEND_FLAVOURS
from .. import tables as L
from .builder import DOMAIN, IR_VERSION, MS_DOMAIN, ONNX_TYPES, OPSET, Builder, LoweringError, numbering, value_info
from .functions import FUNCTIONS, function_proto

FLAVOURS = BACKEND_FLAVOURS["onnx"]
PRESENT = "present."


def tensor_proto(name: str, t: torch.Tensor) -> onnx.TensorProto:
    """An initializer holding `t`'s bytes (every dtype, bf16 included)."""
    if t.is_meta:
        raise LoweringError(f"weight {name!r} has no data (a meta-device model): build the model with weights")
    t = t.detach().cpu().contiguous()
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = ONNX_TYPES[_dtype(t)]
    proto.dims.extend(t.shape)
    proto.raw_data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return proto


def _dtype(t: torch.Tensor) -> str:
    from ...ir import dtype_name

    return dtype_name(t.dtype)


@dataclass
class Lowering:
    """The state of one graph being lowered; the tables' builders receive it as `lx`."""

    graph: Graph
    flavour: str = "portable"
    b: Builder = field(init=False)
    initializers: dict[str, onnx.TensorProto] = field(default_factory=dict)
    functions: dict[str, onnx.FunctionProto] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    report: Counter = field(default_factory=Counter)  # (IR op, "domain::op") -> count

    def __post_init__(self):
        if self.flavour not in FLAVOURS:
            raise ValueError(f"onnx flavour must be one of {FLAVOURS}, got {self.flavour!r}")
        self.b = Builder("main", bind=self._bind)
        self._bound: dict[str, str] = {}

    # ---- values --------------------------------------------------------------------
    def type(self, value: str):
        return self.graph.types[value]

    def attrs(self, node: Node) -> dict:
        """The node's attributes with the op's defaults filled in."""
        return OPS[node.op].full_attrs(node.attrs)

    def outs(self, node: Node) -> list[str]:
        """The ONNX names the node's outputs are written to, in order."""
        return [self.out(node, i) for i in range(len(node.outputs))]

    def x(self, value: str) -> str:
        """The ONNX name of IR value `value` (a weight becomes an initializer on first use)."""
        if value in self.graph.weights:
            if value not in self.initializers:
                self.initializers[value] = tensor_proto(value, self.graph.weights[value])
            return value
        return self.names.get(value, value)

    def out(self, node: Node, i: int) -> str:
        v = node.outputs[i]
        return self.names.get(v, v)

    def transposed(self, value: str) -> str:
        """value^T of a 2-D value: a transposed initializer for a weight, else a Transpose."""
        if value not in self.graph.weights:
            return self.b.Transpose(self.x(value), perm=[1, 0])
        name = f"{value}.T"
        if name not in self.initializers:
            self.initializers[name] = tensor_proto(name, self.graph.weights[value].t())
        return name

    def weight_as(self, value: str, suffix: str, fn) -> str | None:
        """An initializer holding fn(weight) (a layout change), or None when `value` is not a weight."""
        if value not in self.graph.weights:
            return None
        name = f"{value}.{suffix}"
        if name not in self.initializers:
            self.initializers[name] = tensor_proto(name, fn(self.graph.weights[value]))
        return name

    def _bind(self, symbol: str) -> str:
        if symbol not in self._bound:
            for inp in self.graph.inputs:
                for axis, d in enumerate(self.type(inp).shape):
                    if isinstance(d, sympy.Symbol) and d.name == symbol:
                        self._bound[symbol] = self.b.shape_of(inp, axis)
                        return self._bound[symbol]
            raise LoweringError(f"{self.graph.name}: dim {symbol} is not a dim of any graph input")
        return self._bound[symbol]

    # ---- k3c-domain calls ----------------------------------------------------------
    def call(self, name: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        """A node of the k3c domain; its FunctionProto is added to the model."""
        if name not in FUNCTIONS:
            raise LoweringError(f"no k3c function {name!r}")
        if name not in self.functions:
            self.functions[name] = function_proto(name)
        self.b.op(name, inputs, outputs, domain=DOMAIN, **attrs)

    # ---- the walk ------------------------------------------------------------------
    def lowering_of(self, node: Node) -> L.Lowering:
        """The ort flavour's own mapping where it supports the node, else the portable one."""
        tables = ("onnx:ort", "onnx") if self.flavour == "ort" else ("onnx",)
        why = ""
        for table in tables:
            low, why = L.find(table, node, self.graph)
            if low is not None:
                return low
        raise LoweringError(f"op {node.op!r} has no ONNX lowering here: {why} ({node.describe()})")

    def run(self) -> onnx.GraphProto:
        g = self.graph
        out_names = self._plan_outputs()
        for node in g.nodes:
            before = len(self.b.nodes)
            self.lowering_of(node).fn(self, node, **named_inputs(node))
            for n in _walk(self.b.nodes[before:]):
                if n.domain in (DOMAIN, MS_DOMAIN) or n.op_type in ("RMSNormalization", "Attention", "Conv", "Gemm"):
                    self.report[(node.op, f"{n.domain or 'ai.onnx'}::{n.op_type}")] += 1
        for (_, value), name in zip(g.outputs, out_names):
            if self.x(value) != name:
                self.b.Identity(self.x(value), outputs=[name])
        inputs = [value_info(i, self.type(i).dtype, self.type(i).shape) for i in g.inputs]
        outputs = [value_info(name, self.type(v).dtype, self.type(v).shape)
                   for (_, v), name in zip(g.outputs, out_names)]
        return oh.make_graph(self.b.nodes, g.name, inputs, outputs, list(self.initializers.values()))

    def _plan_outputs(self) -> list[str]:
        """ONNX names of the outputs; the producing node of an output's value writes it directly."""
        g = self.graph
        inputs = set(g.inputs)
        names = [PRESENT + out if out in inputs else out for out, _ in g.outputs]
        produced = {o for n in g.nodes for o in n.outputs}
        taken: set[str] = set()
        for (_, value), name in zip(g.outputs, names):
            if value in produced and value not in taken and value not in self.names:
                self.names[value] = name
                taken.add(value)
        reserved = set(names) | inputs
        for v in produced:  # a value spelled like an output it is not: rename it
            if v not in self.names and v in reserved:
                self.names[v] = f"{v}.value"
        return names


def _walk(nodes):
    """Nodes and the nodes of their subgraphs (If branches, Loop and Scan bodies)."""
    for n in nodes:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk(a.g.node)


def lower_graph(graph: Graph, flavour: str = "portable",
                metadata: dict[str, str] | None = None) -> tuple[onnx.ModelProto, Counter]:
    """Lower one IR graph; returns the model (initializers inline) and what the custom ops became."""
    with numbering():
        lx = Lowering(graph, flavour)
        body = lx.run()
    from .cache import OPSET_OF

    used = [n.op_type for n in _walk(body.node)] + [n.op_type for f in lx.functions.values() for n in _walk(f.node)]
    opsets = [oh.make_opsetid("", max([OPSET] + [OPSET_OF.get(op, 0) for op in used]))]
    if lx.functions or DOMAIN in lx.b.domains:
        opsets.append(oh.make_opsetid(DOMAIN, 1))
    if MS_DOMAIN in lx.b.domains:
        opsets.append(oh.make_opsetid(MS_DOMAIN, 1))
    from ... import __version__

    model = oh.make_model(body, opset_imports=opsets, functions=list(lx.functions.values()),
                          ir_version=IR_VERSION, producer_name="k3c", producer_version=__version__)
    for k, v in (metadata or {}).items():
        oh.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, k: str(v)})
    return model, lx.report
