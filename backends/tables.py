"""One lowering table per backend: how each IR op becomes that backend's code, and when it can.

    @k3c.backends.lowering("tvm", "my_op", supports=my_check)
    def lower_my_op(ctx, node, x, w):          # TVM: Relax expressions in, Relax expression(s) out
        ...

A `Lowering` holds the function and, beside it, `supports(node, graph) -> (ok, reason)`.
Each backend reads its table (and nothing else) to lower a node and to say whether it can;
the support matrix (`k3c ops`) reads the same tables. An op with no lowering but with a
`decompose` rule in its spec still runs: `k3c.compile` rewrites it into its decomposition
first (k3c.passes.legalize), until every node is one the backend lowers.

Tables and the signature of their functions (each backend's README says more):

    onnx       fn(lx, node) -> None            emit ONNX nodes with lx.b; read inputs as
                                               lx.x(value), write outputs to lx.out(node, i)
    onnx:ort   the same; the `ort` flavour tries these first and falls back to `onnx` when
               `supports` says no
    tvm        fn(ctx, node, *inputs) -> relax.Expr | list[relax.Expr]
    triton     fn(cg, node) -> str             one statement of the generated module
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..ir import OPS, Graph, Node
from ..registry import Registry

Supports = Callable[[Node, Graph], tuple[bool, str]]


@dataclass(frozen=True)
class Lowering:
    backend: str
    op: str
    fn: Callable
    supports: Supports | None = None
    kind: str = "user"  # what the support matrix shows: "std", "fn", "TIR", "kernel", a target op, ...

    def check(self, node: Node, graph: Graph) -> tuple[bool, str]:
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
    "triton": ("k3c.backends.triton.lowering",),
}
_loaded: set[str] = set()


def _table(backend: str) -> Registry:
    if backend not in TABLES:
        raise KeyError(f"no lowering table {backend!r}; known: {', '.join(TABLES)}")
    return TABLES[backend]


def builtin(backend: str, *ops: str, supports: Supports | None = None, kind: str):
    """Decorator for k3c's own lowerings (the modules of _BUILTIN): register fn for `ops`."""
    def deco(fn: Callable) -> Callable:
        for op in ops:
            _table(backend).add(op, Lowering(backend, op, fn, supports, kind), builtin=True)
        return fn
    return deco


def load(backend: str) -> Registry:
    """The table of `backend` with its built-in lowerings in it."""
    table = _table(backend)
    if backend not in _loaded:
        _loaded.add(backend)  # first: the modules below register through `builtin`
        try:
            for module in _BUILTIN[backend]:
                importlib.import_module(module)
        except BaseException:
            _loaded.discard(backend)
            raise
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


__all__ = ["Lowering", "TABLES", "lowering", "builtin", "load", "find"]
