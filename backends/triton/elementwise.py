"""Elementwise groups -> generated Triton kernels.

A group is a tree of elementwise IR nodes with one result (see fusion.py). Its kernel loads
each outside input once per element, evaluates the whole expression in fp32 registers and
stores only the result: one launch and one round trip to memory instead of one per node.

Inputs whose shape is the result's shape are read at the flat offset; the others broadcast
and are read through their strides (0 along a broadcast dim), so any broadcasting of the
IR's binary ops is one kernel. Constants become literals. Two groups with the same
expression share one kernel (the key is the kernel's text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...ir import OPS, Graph, Node, named_inputs
from ...ir import dims as D
from ...ir.types import FLOATS
from .. import tables as L

GELU_TANH = "0.5 * {a} * (1.0 + tanh(0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a})))"
TL_DTYPES = {"f32": "tl.float32", "f16": "tl.float16", "bf16": "tl.bfloat16", "f64": "tl.float64"}
WIDTH = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16}


def expr_of(op: str) -> str | None:
    """The op's Triton expression over its operands {a}, {b}, {c} (fp32 blocks) and its float
    attributes by name: the `expr` of its entry in the `triton` table (lowering.py), None for an
    op that joins no generated kernel."""
    low = L.load("triton").get(op)
    return None if low is None else low.expr


def const_value(node: Node) -> float | None:
    """The value of a floating `const` node, else None."""
    if node.op != "const" or node.attrs.get("dtype") not in FLOATS:
        return None
    return float(node.attrs["value"])


def literal(x: float) -> str:
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(float(x))


def pow_expr(base: str, exponent: float) -> str | None:
    """x ** e for the exponents models use, without log (x may be negative); None otherwise."""
    if exponent == 0.5:
        return f"tl.sqrt({base})"
    if exponent == -0.5:
        return f"tl.rsqrt({base})"
    if exponent == int(exponent) and 1 <= abs(exponent) <= 4:
        prod = " * ".join([base] * int(abs(exponent)))
        return f"({prod})" if exponent > 0 else f"1.0 / ({prod})"
    return None


def fusible(node: Node, graph: Graph, consts: dict[str, float]) -> bool:
    """Whether `node` can be a member of a generated elementwise kernel."""
    out_dtype = graph.types[node.outputs[0]].dtype
    x = named_inputs(node) if node.op in ("cast", "pow", "where") else {}
    if node.op == "cast":
        return out_dtype in FLOATS and graph.types[x["x"]].dtype in FLOATS
    if node.op == "pow":
        return out_dtype in FLOATS and x["b"] in consts and pow_expr("x", consts[x["b"]]) is not None
    if node.op in ("less", "greater"):
        return all(graph.types[i].dtype in FLOATS for i in node.inputs)
    if node.op == "where":
        return out_dtype in FLOATS and graph.types[x["cond"]].dtype == "bool"
    return expr_of(node.op) is not None and out_dtype in FLOATS


@dataclass
class Group:
    """Elementwise nodes computing one value (`root`); `inputs` are read from outside."""

    nodes: list[Node]  # in graph order, root last
    inputs: list[str] = field(default_factory=list)

    @property
    def root(self) -> Node:
        return self.nodes[-1]


@dataclass
class KernelText:
    name: str
    source: str
    expression: str
    broadcast: bool  # takes sizes and strides (launched by runtime.broadcast)


def kernel_for(group: Group, graph: Graph, consts: dict[str, float], name: str) -> KernelText:
    """The Triton source of `group` as kernel `name`.

    Signature: (x0 .. xm-1, y, n, BLOCK) when every input has the result's shape (read at
    the flat offset); with a broadcast input, also the result's sizes S0 .. Sr-1 and each
    input's strides s<i>_<d> once broadcast to the result (see runtime.elementwise)."""
    out = graph.types[group.root.outputs[0]]
    rank = out.rank
    members = {o for n in group.nodes for o in n.outputs}
    compute = "tl.float64" if any(graph.types[v].dtype == "f64" for v in members | set(group.inputs)) else "tl.float32"
    broadcast = [not _same_shape(graph.types[v].shape, out.shape) for v in group.inputs]
    operand: dict[str, str] = {}
    shown: dict[str, tuple[str, bool]] = {}  # value -> (expression over x0, x1, ..., is it infix)
    body = ["o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "m = o < n"]
    if any(broadcast):
        body.extend(_unravel(rank))
    for i, v in enumerate(group.inputs):
        offs = (" + ".join(f"i{d} * s{i}_{d}" for d in range(rank)) or "0") if broadcast[i] else "o"
        load = f"tl.load(x{i} + {offs}, mask=m, other=0)"
        if graph.types[v].dtype != "bool":
            load += f".to({compute})"
        body.append(f"b_x{i} = {load}")
        operand[v] = f"b_x{i}"
        shown[v] = (f"x{i}", False)
    for k, node in enumerate(group.nodes):
        args = [_operand(i, operand, consts) for i in node.inputs]
        body.append(f"b_{k} = {_expression(node, args, graph, consts)}")
        operand[node.outputs[0]] = f"b_{k}"
        shown[node.outputs[0]] = _shown(node, [_shown_operand(i, shown, consts) for i in node.inputs], graph, consts)
    body.append(f"tl.store(y + o, {operand[group.root.outputs[0]]}.to(y.dtype.element_ty), mask=m)")
    expression = shown[group.root.outputs[0]][0]
    params = [f"x{i}" for i in range(len(group.inputs))] + ["y", "n"]
    if any(broadcast):
        params += [f"S{d}" for d in range(rank)]
        params += [f"s{i}_{d}" for i in range(len(group.inputs)) for d in range(rank)]
    params.append("BLOCK: tl.constexpr")
    lines = ["@triton.jit", f"def {name}({', '.join(params)}):", f'    """y = {expression}"""']
    lines += ["    " + b for b in body]
    return KernelText(name, "\n".join(lines), expression, any(broadcast))


def _shown_operand(value: str, shown: dict, consts: dict[str, float]) -> tuple[str, bool]:
    return shown[value] if value in shown else (literal(consts[value]), consts[value] < 0)


def _shown(node: Node, args: list[tuple[str, bool]], graph: Graph, consts: dict[str, float]) -> tuple[str, bool]:
    """The node's expression for the kernel's docstring, with parentheses only where needed."""
    infix = node.op in ("add", "sub", "mul", "div", "neg", "less", "greater", "reciprocal") or (
        node.op == "pow" and "*" in (pow_expr("x", consts.get(named_inputs(node)["b"], 0.0)) or ""))
    texts = [f"({t})" if (inf and infix) else t for t, inf in args]
    return _expression(node, texts, graph, consts).replace("tl.", ""), infix


def _same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(D.equal(x, y) for x, y in zip(a, b))


def _unravel(rank: int) -> list[str]:
    """The multi-index i0 .. i{r-1} of the flat offset o over the result's sizes S0 .. S{r-1}."""
    lines, rest = [], "o"
    for d in reversed(range(rank)):
        if d == 0:
            lines.append(f"i0 = {rest}")
        else:
            lines.append(f"i{d} = {rest} % S{d}")
            lines.append(f"r{d} = {rest} // S{d}")
            rest = f"r{d}"
    return lines


def _operand(value: str, operand: dict[str, str], consts: dict[str, float]) -> str:
    if value in operand:
        return operand[value]
    return literal(consts[value])


def _expression(node: Node, args: list[str], graph: Graph, consts: dict[str, float]) -> str:
    a, b, c = (args + [None, None, None])[:3]
    if node.op == "pow":
        return pow_expr(a, consts[named_inputs(node)["b"]])  # fusible() checked the exponent
    if node.op == "cast":
        src, dst = graph.types[named_inputs(node)["x"]].dtype, node.attrs["dtype"]
        return f"{a}.to({TL_DTYPES[dst]}).to({TL_DTYPES['f32']})" if WIDTH[dst] < WIDTH[src] else a
    if node.op == "gelu" and node.attrs.get("approximate", "none") == "tanh":
        return GELU_TANH.format(a=a)
    attrs = OPS[node.op].full_attrs(node.attrs)
    return expr_of(node.op).format(a=a, b=b, c=c, **{k: literal(v) for k, v in attrs.items()
                                                  if isinstance(v, (int, float)) and not isinstance(v, bool)})
