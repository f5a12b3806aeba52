"""One lowering table per backend: how each IR op becomes that backend's code, and when it can.

    @k3c.backends.lowering("tvm", "my_op", supports=my_check)
    def lower_my_op(ctx, node, x, w):          # TVM: Relax expressions in, Relax expression(s) out
        ...

One contract for every backend: the walker calls `fn(ctx, node, **inputs)` with the node's
inputs as keywords named by its op's spec (`k3c.ir.named_inputs`: a variadic input as a list,
an absent optional one as None), and `ctx.attrs(node)` has its attributes with the defaults
filled in. A lowering shared by several ops takes `**inputs` (in the spec's order). A
family's lowering (`builtin_family`: the delta rules) covers each op of the family, one a
user declares later included, and reads what varies from the op's spec.

A `Lowering` holds the function and, beside it, `supports(node, graph) -> (ok, reason)`.
Each backend reads its table (and nothing else) to lower a node and to say whether it can;
the support matrix (`k3c ops`) reads the same tables. An op with no lowering but with a
`decompose` rule in its spec still runs: `k3c.compile` rewrites it into its decomposition
first (k3c.passes.legalize), until every node is one the backend lowers.

Tables and the signature of their functions (each backend's README says more):

    onnx       fn(lx, node, **inputs) -> None  inputs: IR values; emit ONNX nodes with lx.b,
                                               lx.x(value) an input's ONNX name, lx.outs(node)
                                               the outputs to write
    onnx:ort   the same; the `ort` flavour tries these first and falls back to `onnx` when
               `supports` says no
    tvm        fn(ctx, node, **inputs) -> relax.Expr | list[relax.Expr]
                                               inputs: Relax values (ctx.ir(node): the IR values)
    triton     fn(cg, node, **inputs) -> str   inputs: IR values (cg.val(value) its Python
                                               name); one statement of the generated module
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..ir import OPS, Graph, Node
from ..ir.ops import family
from ..ir.types import FLOATS
from ..registry import Registry

Supports = Callable[[Node, Graph], tuple[bool, str]]


@dataclass(frozen=True)
class Lowering:
    """One (backend, op) entry. Besides the function and its `supports`:

    - `floats`: the float dtypes its code computes in (the backend's float policy for this
      lowering: "f32" for the ONNX function bodies, onnxruntime's kernels and the TensorIR
      kernels); None takes any. A node with another float value is refused by `check`.
    - `variants` / `variant(node)`: the named forms the lowering emits, and which one a node
      takes (ONNX: the k3c-domain function, functions/); `check` refuses a node whose variant
      is not one of them, so a missing body is a `supports` answer, not a lowering error.
    - `expr`: the op's expression inside a generated elementwise kernel (Triton: the
      planner fuses the op into its neighbours' kernel; `fn` is its form outside one).
    """

    backend: str
    op: str
    fn: Callable
    supports: Supports | None = None
    kind: str = "user"  # what the support matrix shows: "std", "fn", "TIR", "kernel", a target op, ...
    floats: tuple[str, ...] | None = None
    variants: tuple[str, ...] = ()
    variant: Callable[[Node], str] | None = None
    expr: str | None = None

    def check(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if self.floats is not None:
            for v in node.inputs + node.outputs:
                dtype = graph.types[v].dtype
                if dtype in FLOATS and dtype not in self.floats:
                    return False, (f"the {self.backend} {self.kind} lowering of {node.op} computes in "
                                   f"{'/'.join(self.floats)} only; %{v} is {dtype}")
        if self.variant is not None and self.variant(node) not in self.variants:
            return False, (f"no {self.backend} form {self.variant(node)!r} of {node.op} "
                           f"(it has {', '.join(self.variants)})")
        return self.supports(node, graph) if self.supports is not None else (True, "")


TABLES: dict[str, Registry] = {b: Registry(f"{b} lowering of op") for b in ("onnx", "onnx:ort", "tvm", "triton")}

# The modules that fill each table with the built-in lowerings (imported on first use: the
# toolchains are heavy, and a table is only read when its backend is asked for).
_BUILTIN = {
    "onnx": ("k3c.backends.onnx.standard", "k3c.backends.onnx.custom", "k3c.backends.onnx.functions",
             "k3c.backends.onnx.cache"),
    "onnx:ort": ("k3c.backends.onnx.ort", "k3c.backends.onnx.ort_mxfp4"),
    "tvm": ("k3c.backends.tvm.relax_ops", "k3c.backends.tvm.kernel_ops", "k3c.backends.tvm.chunk_ops",
            "k3c.backends.tvm.quant_ops", "k3c.backends.tvm.cache_ops"),
    "triton": ("k3c.backends.triton.lowering", "k3c.backends.triton.cache_ops"),
}
_loaded: set[str] = set()


def _table(backend: str) -> Registry:
    if backend not in TABLES:
        raise KeyError(f"no lowering table {backend!r}; known: {', '.join(TABLES)}")
    return TABLES[backend]


def builtin(backend: str, *ops: str, supports: Supports | None = None, kind: str, **fields):
    """Decorator for k3c's own lowerings (the modules of _BUILTIN): register fn for `ops`
    (`fields`: the other fields of `Lowering`, such as `floats` or `expr`)."""
    def deco(fn: Callable) -> Callable:
        for op in ops:
            _table(backend).add(op, Lowering(backend, op, fn, supports, kind, **fields), builtin=True)
        return fn
    return deco


# backend -> [(family, make)]: a lowering of every op of an IR family (ir.ops.family), those
# declared after the table loaded included: `load` enters each member the table lacks.
_FAMILY_LOWERINGS: dict[str, list[tuple[str, Callable[[str], Lowering], Callable | None]]] = {b: [] for b in TABLES}


def builtin_family(backend: str, family_name: str, *, supports: Supports | None = None, kind: str,
                   per_op: Callable[[str], dict] | None = None, forget: Callable[[frozenset], None] | None = None,
                   **fields):
    """Decorator for k3c's own lowering of a whole op family (the delta rules: the lowering
    reads what varies from each op's spec): every member, present or declared later, gets
    an entry of `fn` (`per_op(op)`: fields that name the op, such as ONNX's variants, made
    with the entry; `forget(members)`: drop what per_op made for ops no longer members)."""
    def deco(fn: Callable) -> Callable:
        def make(op: str) -> Lowering:
            return Lowering(backend, op, fn, supports, kind, **fields, **(per_op(op) if per_op else {}))
        _FAMILY_LOWERINGS[backend].append((family_name, make, forget))
        _enter_members(backend)
        return fn
    return deco


def _enter_members(backend: str) -> None:
    table = _table(backend)
    for family_name, make, forget in _FAMILY_LOWERINGS[backend]:
        members = family(family_name)
        for op in sorted(members):
            if op not in table:
                table.add(op, make(op))
        if forget is not None:
            forget(members)


def load(backend: str) -> Registry:
    """The table of `backend` with its built-in lowerings in it (and an entry of each family
    lowering for every member of the family declared now)."""
    table = _table(backend)
    if backend not in _loaded:
        _loaded.add(backend)  # first: the modules below register through `builtin`
        try:
            for module in _BUILTIN[backend]:
                importlib.import_module(module)
        except BaseException:
            _loaded.discard(backend)
            raise
    _enter_members(backend)
    return table


def lowering(backend: str, op: str, *, supports: Supports | None = None, kind: str = "user",
             replace: bool = False):
    """Decorator: `fn` lowers IR op `op` on `backend` ("onnx", "onnx:ort", "tvm", "triton"),
    with `supports(node, graph) -> (ok, reason)` saying when it can (None: always).

    The op must be declared (k3c.ir.ops.defop). Replacing one of k3c's own lowerings needs
    `replace=True`; inside `k3c.registry.scope()` a registration lasts until the block ends.
    """
    if op not in OPS:
        raise KeyError(f"op {op!r} is not declared (declare it with k3c.ir.ops.defop first)")
    table = load(backend)

    def deco(fn: Callable) -> Callable:
        table.add(op, Lowering(backend, op, fn, supports, kind), replace=replace)
        return fn
    return deco


def find(backend: str, node: Node, graph: Graph) -> tuple[Lowering | None, str]:
    """The lowering of `node` on `backend` if it has one that supports it, else (None, why)."""
    low = load(backend).get(node.op)
    if low is None:
        how = " (its decomposition runs instead)" if _decomposable(node.op) else ""
        return None, f"no {backend} lowering for op {node.op!r}{how}"
    ok, why = low.check(node, graph)
    return (low, "") if ok else (None, why)


def _decomposable(op: str) -> bool:
    spec = OPS.get(op)
    return spec is not None and spec.decompose is not None


__all__ = ["Lowering", "TABLES", "lowering", "builtin", "builtin_family", "load", "find"]
