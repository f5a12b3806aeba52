"""`torch.ops.k3c.<name>` made from an op's spec: the schema from its signature, the fake
from its shape inference, the implementation from its `eager` function.

torch.export keeps each such op as one node with dynamic B and T, and the frontend maps it
back to the IR op of the same name by the schema's argument names (frontend/table.py), so
nothing outside the spec restates the op's inputs. Nothing is mutated: a state goes in and
the new state comes out.

The implementation looks the spec up at call time, so `defop(..., replace=True)` of an op
that has a torch op already swaps the implementation (torch cannot drop an op it has).
"""

from __future__ import annotations

import inspect

import sympy
import torch

from .. import dims as D
from ..types import DTYPES, TensorType
from .spec import OPS, REQUIRED, OpSpec

_ANNOTATIONS = {"float": float, "int": int, "bool": bool, "str": str, "dim": int, "number": float,
                "ints": list[int]}
_REGISTERED: dict[str, tuple] = {}  # op name -> the signature its torch op was made with


def _signature(spec: OpSpec) -> inspect.Signature:
    params = []
    for name in spec.inputs:
        if name.endswith("*"):
            raise ValueError(f"op {spec.name}: a variadic input cannot be a torch op argument")
        ann = torch.Tensor | None if name.endswith("?") else torch.Tensor
        params.append(inspect.Parameter(name.rstrip("?"), inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ann))
    for name, a in spec.attr_specs.items():
        if a.kind == "rows":  # the data decides it: no argument (the fake makes a fresh size)
            continue
        if a.kind not in _ANNOTATIONS:
            raise ValueError(f"op {spec.name}: attribute {name} of kind {a.kind} has no torch schema type")
        ann = _ANNOTATIONS[a.kind] | None if a.optional else _ANNOTATIONS[a.kind]
        default = inspect.Parameter.empty if a.default is REQUIRED else a.default
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ann,
                                        default=default))
    n = len(spec.outputs)
    ret = torch.Tensor if n == 1 else tuple[(torch.Tensor,) * n]
    return inspect.Signature(params, return_annotation=ret)


def _split(spec: OpSpec, args: tuple) -> tuple[list, dict]:
    n = len(spec.inputs)
    return list(args[:n]), dict(zip(_torch_attrs(spec), args[n:]))


def _torch_attrs(spec: OpSpec) -> list[str]:
    """The attributes that are arguments of the torch op, in order (not the "rows" dims)."""
    return [k for k, a in spec.attr_specs.items() if a.kind != "rows"]


def _rows_attrs(spec: OpSpec) -> list[str]:
    return [k for k, a in spec.attr_specs.items() if a.kind == "rows"]


def _fresh(outs, inputs) -> tuple:
    """Outputs that own their memory: a custom op may not return (a view of) an input."""
    ptrs = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor) and x.numel()}
    fixed = []
    for o in outs:
        o = o.contiguous()
        if o.numel() and o.untyped_storage().data_ptr() in ptrs:
            o = o.clone()
        fixed.append(o)
    return tuple(fixed)


def _impl(name: str):
    def impl(*args):
        spec = OPS[name]
        ins, attrs = _split(spec, args)
        out = spec.eager(*ins, **attrs)
        outs = _fresh(out if isinstance(out, (tuple, list)) else (out,), ins)
        return outs if len(spec.outputs) > 1 else outs[0]
    return impl


def _fake(name: str):
    def fake(*args):
        spec = OPS[name]
        ins, attrs = _split(spec, args)
        leaves: dict = {}
        types = [None if x is None else _type_of(x, leaves) for x in ins]
        while types and types[-1] is None:  # absent optional inputs
            types.pop()
        for k in _rows_attrs(spec):  # a size only the data knows: unbacked while tracing
            size = torch.library.get_ctx().new_dynamic_size()
            attrs[k] = sympy.sympify(size.node.expr)
            leaves[attrs[k]] = size
        with D.assuming_equal() as pairs:
            inferred = spec.infer(*types, **spec.full_attrs(attrs))
        for a, b in pairs:  # what the op needs of its inputs' sizes, told to torch
            torch._check(_size(a, leaves) == _size(b, leaves),
                         lambda a=a, b=b: f"{spec.name}: sizes {a} and {b} differ")
        outs = [torch.empty([_size(d, leaves) for d in t.shape], dtype=DTYPES[t.dtype], device=ins[0].device)
                for t in inferred]
        return tuple(outs) if len(outs) > 1 else outs[0]
    return fake


def _type_of(x: torch.Tensor, leaves: dict) -> TensorType:
    from ..types import dtype_name

    dims = []
    for s in x.shape:
        if isinstance(s, torch.SymInt):
            expr = sympy.sympify(s.node.expr)
            leaves.setdefault(expr, s)
            dims.append(expr)
        else:
            dims.append(int(s))
    return TensorType(dtype_name(x.dtype), tuple(dims))


def _size(d, leaves: dict):
    """An inferred dim back as a size: an int, an input's SymInt, or arithmetic on them."""
    if isinstance(d, int):
        return d
    if d in leaves:
        return leaves[d]
    if d.is_Integer:
        return int(d)
    if not d.free_symbols <= set(leaves):
        # a product the inputs hold only whole (B*T in [B*T, k] -> route [B*T*k + 2M]): name the
        # inputs' compound sizes and write d in them
        names = {e: sympy.Dummy() for e in leaves if not e.is_Symbol}
        d2 = d.subs(names)
        if d2 != d and d2.free_symbols <= set(leaves) | set(names.values()):
            return _size(d2, {**leaves, **{names[e]: leaves[e] for e in names}})
    if d.is_Symbol:
        raise ValueError(f"inferred dim {d} is no dim of the inputs")
    args = [_size(a, leaves) for a in d.args]
    if d.is_Add:
        return sum(args[1:], args[0])
    if d.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    raise ValueError(f"inferred dim {d} cannot be computed from the inputs' sizes")


def register_torch_op(spec: OpSpec) -> None:
    """Make `torch.ops.k3c.<spec.name>` (once per process; a replaced spec with the same
    signature reuses it, a different signature is an error)."""
    sig = _signature(spec)
    key = tuple((p.name, str(p.annotation), p.default) for p in sig.parameters.values()) + (len(spec.outputs),)
    if spec.name in _REGISTERED:
        if _REGISTERED[spec.name] != key:
            raise ValueError(f"torch.ops.k3c.{spec.name} exists with another signature; "
                             f"torch cannot change an op it has registered (restart the process)")
        return
    impl = _impl(spec.name)
    impl.__signature__ = sig
    impl.__name__ = spec.name
    op = torch.library.custom_op(f"k3c::{spec.name}", impl, mutates_args=())
    fake = _fake(spec.name)
    fake.__signature__ = sig
    op.register_fake(fake)
    _REGISTERED[spec.name] = key


def torch_op(name: str):
    """The torch op of IR op `name` (`torch.ops.k3c.<name>.default`), or None."""
    return getattr(torch.ops.k3c, name).default if name in _REGISTERED else None


def torch_ops() -> dict[str, object]:
    """IR op name -> its torch op overload, for every op with an eager implementation."""
    return {name: getattr(torch.ops.k3c, name).default for name in _REGISTERED}
