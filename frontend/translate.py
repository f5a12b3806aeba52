"""From a torch.export ExportedProgram to a k3c Graph.

Each `call_function` node goes through the builder the table (table.py) holds for its
target. Symbolic ints (sym_size, B*T, ...) become dim expressions, not nodes. Types are
inferred by the op specs and checked against torch's own metadata.
"""

from __future__ import annotations

import operator
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import CaptureError
from ..ir import Graph, Node
from ..ir import dims as D
from ..ir.ops import OPS
from ..ir.types import TensorType, dtype_name
from .source import describe, location


class UnsupportedOpError(CaptureError):
    def __init__(self, unknown: list[tuple[str, str]]):
        self.unknown = unknown
        lines = [f"  {op}  at {where}" for op, where in unknown]
        super().__init__(f"{len(unknown)} unsupported op(s) in the model (k3c's frontend has no "
                         f"builder for them):\n" + "\n".join(lines))


class Translator:
    def __init__(self, ep: ExportedProgram, graph: Graph, symbol_names: dict[sympy.Symbol, str],
                 input_names: list[str], output_names: list[str], weight_prefix: str = ""):
        self.ep, self.g = ep, graph
        self.rename = {s: D.sym(n) for s, n in symbol_names.items()}
        self.input_names, self.output_names = input_names, output_names
        self.weight_prefix = weight_prefix
        self.env: dict[str, Any] = {}  # fx node name -> IR value name | tuple | dim
        self.fx_node: torch.fx.Node | None = None

    # ---- helpers used by builders --------------------------------------------------
    def dim(self, x) -> D.Dim:
        """An int, a SymInt or an fx node that yields one -> a dim expression."""
        if isinstance(x, torch.fx.Node):
            v = self.env.get(x.name)
            if v is not None and not isinstance(v, str):
                return v
            x = x.meta["val"]
        if isinstance(x, torch.SymInt):
            return D.normalize(sympy.sympify(x.node.expr).xreplace(self.rename))
        if isinstance(x, (int, sympy.Basic)):
            return D.normalize(x)
        raise CaptureError(f"expected an integer or symbolic size, got {x!r}")

    def data_dim(self) -> sympy.Symbol:
        """A fresh dim for a size the data decides (R1, R2, ...: rows an all-to-all brings),
        declared in the graph; the torch size it stands for is matched when the types are."""
        n = 1 + sum(1 for d in self.g.dims if d.startswith("R") and d[1:].isdigit())
        while f"R{n}" in self.g.dims:
            n += 1
        self.g.dims[f"R{n}"] = (0, None)
        return D.sym(f"R{n}")

    def ttype(self, val: torch.Tensor) -> TensorType:
        return TensorType(dtype_name(val.dtype), tuple(self.dim(s) for s in val.shape))

    def out_type(self, i: int = 0) -> TensorType:
        val = self.fx_node.meta["val"]
        if isinstance(val, (tuple, list)):
            val = val[i]
        return self.ttype(val)

    def value(self, arg) -> str:
        if not isinstance(arg, torch.fx.Node) or not isinstance(self.env.get(arg.name), str):
            raise CaptureError(f"expected a tensor operand, got {arg!r} at {self.where()}")
        return self.env[arg.name]

    def type_of(self, value: str) -> TensorType:
        return self.g.types[value]

    def where(self) -> str:
        return describe(self.fx_node.meta.get("stack_trace")) if self.fx_node is not None else "?"

    def emit(self, op: str, inputs: list[str], attrs: dict | None = None, name: str | None = None) -> list[str]:
        """Add a node; its output types come from the op's inference."""
        spec = OPS[op]
        attrs = {k: _canon(v) for k, v in (attrs or {}).items()}
        types = spec.infer(*[self.g.types[i] for i in inputs], **spec.full_attrs(attrs))
        base = name or (self.fx_node.name if self.fx_node is not None else op)
        outs = [self.g.fresh(base if len(types) == 1 else f"{base}.{k}") for k in range(len(types))]
        for o, t in zip(outs, types):
            self.g.types[o] = t
        meta = {}
        if self.fx_node is not None:
            loc = location(self.fx_node.meta.get("stack_trace"))
            if loc:
                meta["loc"] = loc
        self.g.nodes.append(Node(op, list(inputs), outs, attrs, meta))
        return outs

    def emit1(self, op: str, inputs: list[str], attrs: dict | None = None, name: str | None = None) -> str:
        return self.emit(op, inputs, attrs, name)[0]

    def const(self, value, dtype: str) -> str:
        return self.emit1("const", [], {"value": value, "dtype": dtype}, name=f"{self.fx_node.name}_c")

    def cast(self, value: str, dtype: str) -> str:
        if self.g.types[value].dtype == dtype:
            return value
        return self.emit1("cast", [value], {"dtype": dtype}, name=f"{value}_{dtype}")

    # ---- the walk ------------------------------------------------------------------
    def run(self, table: dict) -> Graph:
        sig = self.ep.graph_signature
        kinds = {s.arg.name: s for s in sig.input_specs}
        user_i = 0
        for node in self.ep.graph.nodes:
            self.fx_node = node
            if node.op == "placeholder":
                spec = kinds[node.name]
                if spec.kind == InputKind.USER_INPUT:
                    name = self.input_names[user_i]
                    user_i += 1
                    self.g.inputs.append(name)
                    self.g.types[name] = self.ttype(node.meta["val"])
                    self.env[node.name] = name
                elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                    name = spec.target[len(self.weight_prefix):] if spec.target.startswith(self.weight_prefix) \
                        else spec.target
                    tensor = _weight_tensor(self.ep, spec)
                    self.g.weights[name] = tensor
                    self.g.types[name] = TensorType.of(tensor)
                    self.env[node.name] = name
                else:
                    raise CaptureError(f"unsupported graph input kind {spec.kind} for {node.name}")
            elif node.op == "call_function":
                self._call(node, table)
            elif node.op == "output":
                self._outputs(node)
        self.fx_node = None
        return self.g

    def _call(self, node: torch.fx.Node, table: dict) -> None:
        val = node.meta.get("val")
        if node.target is operator.getitem:
            src = self.env[node.args[0].name]
            self.env[node.name] = src[node.args[1]]
            return
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool) and node.target not in table:
            self.env[node.name] = self.dim(val)  # symbolic size arithmetic
            return
        if isinstance(val, (torch.SymBool, bool)) and node.target not in table:
            self.env[node.name] = None  # a condition on sizes, read only by torch's runtime asserts (dropped)
            return
        builder = table.get(node.target)
        if builder is None:
            raise CaptureError(f"no builder for {node.target} at {self.where()}")
        result = builder(self, *node.args, **node.kwargs)
        self.env[node.name] = tuple(result) if isinstance(result, list) else result
        self._check_types(node, self.env[node.name])

    def _check_types(self, node: torch.fx.Node, result) -> None:
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        outs = result if isinstance(result, tuple) else (result,)
        for v, o in zip(vals, outs):
            if isinstance(v, torch.Tensor) and isinstance(o, str):
                self._name_data_dims(v, self.g.types[o])
                want, got = self.ttype(v), self.g.types[o]
                if not got.same_as(want):
                    raise CaptureError(f"internal: {node.target} gave {got}, torch says {want} at {self.where()}")

    def _name_data_dims(self, val: torch.Tensor, got: TensorType) -> None:
        """A data-dependent torch size (an unbacked symbol, u0) met first where an op made it:
        it is the dim that op's inference named there (R1)."""
        for s, d in zip(val.shape, got.shape):
            if isinstance(s, torch.SymInt) and isinstance(d, sympy.Symbol):
                e = sympy.sympify(s.node.expr)
                if isinstance(e, sympy.Symbol) and e not in self.rename and e.name.startswith("u"):
                    self.rename[e] = d

    def _outputs(self, node: torch.fx.Node) -> None:
        specs = self.ep.graph_signature.output_specs
        args = node.args[0]
        user = [a for a, s in zip(args, specs) if s.kind == OutputKind.USER_OUTPUT]
        if len(user) != len(args):
            raise CaptureError("the model mutates a buffer or input in place; k3c captures pure functions only")
        for name, a in zip(self.output_names, user):
            self.g.outputs.append((name, self.value(a)))


def _weight_tensor(ep: ExportedProgram, spec) -> torch.Tensor:
    if spec.kind == InputKind.CONSTANT_TENSOR:
        return ep.constants[spec.target].detach()
    return ep.state_dict[spec.target].detach()


def _canon(v):
    """Attribute values in canonical form: lists, not tuples; python scalars, not SymInts."""
    if isinstance(v, (tuple, list)):
        return [_canon(x) for x in v]
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    return v
