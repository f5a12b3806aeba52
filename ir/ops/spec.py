"""One declaration per op: signature, typed attributes, shape inference, reference, cost,
and optionally a decomposition and an eager torch op.

    defop("kda", "q k v g beta state", "o state_out", attrs={"scale": attr("float")},
          infer=..., ref=..., flops=..., eager=..., families="recurrent delta_family")

An `OpSpec` is plain data and the only place an op's inputs, outputs and attributes are
written down; everything else (the verifier, the interpreter, the torch custom op and its
fake, the frontend's builder, the cost model, the support matrix) reads it from here.

- `infer(*types, **attrs)` returns the output types or raises `ShapeError(rule, message)`.
- `ref(*tensors, **attrs)` is the naive reference the interpreter runs (attrs arrive with
  defaults filled in and symbolic dims evaluated to ints).
- `flops(in_shapes, out_shapes, attrs) -> int` is the op's cost rule (passes/cost.py adds
  the bytes); None counts a few FLOPs per output element.
- `decompose(b, *inputs, **attrs) -> [values]` writes the op as a graph of other ops with
  the pass Builder; a backend without a lowering of the op runs that instead.
- `eager`: the implementation behind `torch.ops.k3c.<name>` (True: `ref`), registered from
  this signature by ir/ops/torch_ops.py so that models can call the op and torch.export
  keeps it as one node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sympy

from ...errors import ShapeError, UsageError
from ...registry import Registry
from ..types import DTYPES, TensorType


def expect(cond: bool, rule: str, message: str) -> None:
    if not cond:
        raise ShapeError(rule, message)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

# "rows": a dim that the data decides (how many rows an all-to-all brings is known only when
# they arrive): a dim symbol in the IR, no argument of the torch op, whose fake makes it a
# data-dependent size and whose builder names it afresh (R1, R2, ...)
KINDS = ("float", "int", "bool", "str", "dim", "shape", "ints", "dtype", "number", "rows", "any")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_dim(v) -> bool:
    return _is_int(v) or isinstance(v, sympy.Expr)


_F32_MAX = 3.4028234663852886e38
_CHECKS: dict[str, Callable[[Any], bool]] = {
    # float32's range: the backends hold float attributes as float32 (ONNX's are)
    "float": lambda v: (isinstance(v, float) or _is_int(v)) and math.isfinite(v) and abs(v) <= _F32_MAX,
    "int": _is_int,
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dim": _is_dim,
    "rows": lambda v: isinstance(v, sympy.Symbol),
    "shape": lambda v: isinstance(v, (list, tuple)) and all(_is_dim(d) for d in v),
    "ints": lambda v: isinstance(v, (list, tuple)) and all(_is_int(d) for d in v),
    "dtype": lambda v: isinstance(v, str) and v in DTYPES,
    "number": lambda v: (isinstance(v, float) and not math.isnan(v)) or _is_int(v),
    "any": lambda v: True,
}
_ARTICLE = {"float": "a finite float32 value", "int": "an int", "bool": "true or false", "str": "a string",
            "dim": "a dim (an int or an expression of the dims)", "rows": "a dim name (a symbol)",
            "shape": "a list of dims",
            "ints": "a list of ints", "dtype": f"a dtype ({', '.join(DTYPES)})", "number": "a number"}


@dataclass(frozen=True)
class Attr:
    """An attribute's type, default, and allowed values (`choices`, or a range [lo, hi])."""

    kind: str
    default: Any = REQUIRED
    optional: bool = False  # None is allowed too
    choices: tuple | None = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself excluded

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}; known: {', '.join(KINDS)}")

    def problem(self, value) -> str | None:
        """Why `value` is not allowed, or None."""
        if value is None:
            return None if self.optional else "must not be none"
        if not _CHECKS[self.kind](value):
            return f"must be {_ARTICLE[self.kind]}, got {_show(value)}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(repr, self.choices))}, got {value!r}"
        if self.lo is not None and _is_number(value) and (value < self.lo or (self.lo_open and value == self.lo)):
            return f"must be {'>' if self.lo_open else '>='} {self.lo}, got {value!r}"
        if self.hi is not None and _is_number(value) and value > self.hi:
            return f"must be <= {self.hi}, got {value!r}"
        return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(v) -> str:
    return f"{v!r} ({type(v).__name__})"


def attr(kind: str, default: Any = REQUIRED, **limits) -> Attr:
    """attr("float"), attr("float", 1e-5, lo=0, lo_open=True), attr("str", "none", choices=(...))."""
    return Attr(kind, default, **limits)


def _as_attr(value) -> Attr:
    """A plain default (the short form of a user's declaration) as an Attr of its own kind."""
    if isinstance(value, Attr):
        return value
    if value is REQUIRED:
        return Attr("any")
    if value is None:
        return Attr("any", None, optional=True)
    kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(value), "any")
    return Attr(kind, value)


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[str, ...]  # "x", "b?" optional (last only), "xs*" variadic (only one)
    outputs: tuple[str, ...]  # "y"; "ys*" for a count set by attrs (see num_outputs)
    attr_specs: dict[str, Attr]
    infer: Callable[..., list[TensorType]]
    ref: Callable[..., Any]
    doc: str = ""
    num_outputs: Callable[[dict], int] | None = None
    families: frozenset[str] = field(default_factory=frozenset)
    flops: Callable[[list, list, dict], int] | None = None
    decompose: Callable[..., list[str]] | None = None
    eager: Callable[..., Any] | None = None
    delta: Any = None  # a delta-family member's DeltaForm (delta_family.py): its gate kind

    @property
    def attrs(self) -> dict[str, Any]:
        """name -> default (REQUIRED for none)."""
        return {k: a.default for k, a in self.attr_specs.items()}

    @property
    def tensor_inputs(self) -> list[str]:
        return [i.rstrip("?*") for i in self.inputs]

    def arity_ok(self, n: int) -> bool:
        fixed = [i for i in self.inputs if not i.endswith(("?", "*"))]
        if any(i.endswith("*") for i in self.inputs):
            return n >= len(fixed)
        optional = sum(i.endswith("?") for i in self.inputs)
        return len(fixed) <= n <= len(fixed) + optional

    def n_outputs(self, attrs: dict) -> int:
        return self.num_outputs(attrs) if self.num_outputs else len(self.outputs)

    def full_attrs(self, attrs: dict) -> dict:
        """attrs with defaults filled in; a KeyError names a missing required one. A "float"
        attribute written as an int (`beta=2`) arrives as a float, as every backend holds it."""
        out = {}
        for k, a in self.attr_specs.items():
            if k in attrs:
                v = attrs[k]
                out[k] = float(v) if a.kind == "float" and _is_int(v) else v
            elif a.default is REQUIRED:
                raise KeyError(k)
            else:
                out[k] = a.default
        return out

    def attr_problems(self, attrs: dict) -> list[str]:
        """What is wrong with `attrs` (unknown, missing, mistyped or out of range), one line each."""
        problems = [f"unknown attribute {k!r} of {self.name} (it has {', '.join(self.attr_specs) or 'none'})"
                    for k in attrs if k not in self.attr_specs]
        for k, a in self.attr_specs.items():
            if k not in attrs:
                if a.default is REQUIRED:
                    problems.append(f"missing attribute {k!r} of {self.name}")
                continue
            why = a.problem(attrs[k])
            if why:
                problems.append(f"attribute {k} of {self.name} {why}")
        return problems


OPS: Registry = Registry("op")


def defop(name: str, inputs: str, outputs: str = "y", *, attrs: dict | None = None,
          infer: Callable | None = None, ref: Callable, families: str = "", doc: str = "",
          num_outputs: Callable[[dict], int] | None = None, flops: Callable | None = None,
          decompose: Callable | None = None, eager: Callable | bool | None = None,
          replace: bool = False, delta=None) -> OpSpec:
    """Declare op `name`; `inputs`/`outputs`/`families` are space-separated names; `attrs`
    maps each attribute to an `attr(...)` (or, for short, to its plain default). `delta`: a
    delta-family member's `DeltaForm` (delta_family.py), which supplies the shape rule, the
    cost, the `scale` attribute and the families unless they are given."""
    if delta is not None:
        from . import delta_family as df

        if (inputs.split(), outputs.split()) != (delta.inputs.split(), delta.outputs.split()):
            raise UsageError(f"delta op {name!r} with gate {delta.gate!r} takes inputs {delta.inputs!r} and "
                             f"outputs {delta.outputs!r}, not {inputs!r} -> {outputs!r}")
        attrs = {"scale": attr("float", lo=0, lo_open=True)} if attrs is None else attrs
        infer, flops = infer or df.infer(delta), flops or df.flops(delta)
        families = " ".join(dict.fromkeys(f"{families} {df.FAMILIES}".split()))
    if infer is None:
        raise UsageError(f"op {name!r} needs an infer rule (or delta=)")
    spec = OpSpec(name, tuple(inputs.split()), tuple(outputs.split()),
                  {k: _as_attr(v) for k, v in (attrs or {}).items()}, infer, ref, doc, num_outputs,
                  frozenset(families.split()), flops, decompose, ref if eager is True else eager or None, delta)
    previous = OPS.get(name)
    OPS.add(name, spec, replace=replace)
    if spec.eager is not None:
        from .torch_ops import register_torch_op

        try:
            register_torch_op(spec)
        except Exception:
            if previous is None:
                del OPS[name]
            else:
                OPS[name] = previous
            raise
    return spec


def named_inputs(node) -> dict[str, Any]:
    """A node's inputs by the names of its op's spec, in the spec's order: a variadic input as
    the list of its values, an absent optional one as None. What every backend's walker passes
    a lowering as keywords."""
    spec = OPS[node.op]
    values, out = list(node.inputs), {}
    at = 0
    for i, name in enumerate(spec.inputs):
        if name.endswith("*"):
            end = len(values) - (len(spec.inputs) - i - 1)
            out[name[:-1]] = values[at:end]
            at = end
        elif at < len(values):
            out[name.rstrip("?")] = values[at]
            at += 1
        else:
            out[name.rstrip("?")] = None
    return out


def family(name: str) -> frozenset[str]:
    """The ops declared with family `name`."""
    return frozenset(op for op, s in OPS.items() if name in s.families)


class _Families:
    """FAMILIES[name]: the ops of a family, read from OPS (so it cannot go stale)."""

    def __getitem__(self, name: str) -> frozenset[str]:
        ops = family(name)
        if not ops:
            raise KeyError(name)
        return ops

    def get(self, name: str, default=None):
        return family(name) or default

    def __contains__(self, name: str) -> bool:
        return bool(family(name))

    def keys(self) -> list[str]:
        return sorted({f for s in OPS.values() for f in s.families})


FAMILIES = _Families()
