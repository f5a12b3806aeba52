"""What a lowering rule sees: the BlockBuilder, the graph's dims as TIR variables, the target,
and helpers to emit Relax calls and TensorIR kernels (`call_tir`).

A rule is `rule(ctx, node, **inputs) -> relax.Expr | list[relax.Expr]`, one expression per
output of the node, `inputs` the Relax values of the node's inputs as keywords named by the
op's spec (`ctx.ir(node)` has the IR values by the same names, for their types).
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, s_tir, tirx

from ...ir import OPS, Graph, Node, TensorType, named_inputs
from .dims import DimMap

# IR dtype names -> TVM dtype strings
DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
          "i32": "int32", "i8": "int8", "u8": "uint8", "bool": "bool"}

# the TIR op pattern that keeps a hand-scheduled kernel out of Relax's operator fusion
OPAQUE = 8


class LowerContext:
    def __init__(self, bb: relax.BlockBuilder, graph: Graph, target: str, options: dict | None = None,
                 kernels: dict | None = None):
        self.bb, self.graph, self.target = bb, graph, target
        self.dims = DimMap(graph)
        self.options = dict(options or {})
        self.kernels: dict[tuple, relax.GlobalVar] = {} if kernels is None else kernels  # shared per module
        self._producers: dict[str, Node] | None = None
        self._consumers: dict[str, list[Node]] | None = None

    def producer(self, value: str) -> Node | None:
        if self._producers is None:
            self._producers = self.graph.producers()
        return self._producers.get(value)

    def consumers(self, value: str) -> list[Node]:
        """The nodes that read `value`, in graph order."""
        if self._consumers is None:
            self._consumers = {}
            for node in self.graph.nodes:
                for v in dict.fromkeys(node.inputs):
                    self._consumers.setdefault(v, []).append(node)
        return self._consumers.get(value, [])

    # ---- types ---------------------------------------------------------------------
    def type_of(self, value: str) -> TensorType:
        return self.graph.types[value]

    def relax_type(self, t: TensorType) -> relax.TensorType:
        return relax.TensorType(self.dims.shape(t.shape), DTYPES[t.dtype])

    def out_types(self, node: Node) -> list[relax.TensorType]:
        return [self.relax_type(self.type_of(o)) for o in node.outputs]

    def shape(self, value: str) -> list[tvm.ir.PrimExpr]:
        return self.dims.shape(self.type_of(value).shape)

    def attrs(self, node: Node) -> dict:
        return OPS[node.op].full_attrs(node.attrs)

    def ir(self, node: Node) -> dict:
        """The node's IR input values by the names of its op's spec (None: an absent optional one)."""
        return named_inputs(node)

    # ---- kernels -------------------------------------------------------------------
    def kernel(self, key: tuple, make: Callable[[], tirx.PrimFunc],
               schedules: dict[str, Callable] | None = None) -> relax.GlobalVar:
        """The GlobalVar of TensorIR kernel `key` (made and scheduled once per module).

        `make()` builds the PrimFunc; `schedules[target](sch)` schedules it for this target.
        Scheduled kernels are marked opaque so that Relax's fusion leaves them whole.
        """
        if key in self.kernels:
            return self.kernels[key]
        func = make().without_attr("global_symbol")  # named by the module, uniquely
        rule = (schedules or {}).get(self.target)
        if rule is not None:
            sch = s_tir.Schedule(func)
            rule(sch)
            func = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)
        gv = self.bb.add_func(func.with_attr("k3c.kernel", key[0]), key[0])
        self.kernels[key] = gv
        return gv

    def call_tir(self, gv: relax.GlobalVar, args: list, out_types: list[relax.TensorType]) -> list[relax.Expr]:
        """Emit `call_tir(gv, args)` and return one Relax value per output."""
        call = relax.call_tir(gv, args, out_types if len(out_types) > 1 else out_types[0])
        out = self.bb.emit(call)
        if len(out_types) == 1:
            return [out]
        return [self.bb.emit(relax.TupleGetItem(out, i)) for i in range(len(out_types))]
