"""One declaration per op: operands, attributes, shape/dtype inference, reference.

An `OpSpec` is plain data. `infer(*types, **attrs)` returns the output types or raises
`ShapeError(rule, message)`; `ref(*tensors, **attrs)` is the naive reference the
interpreter calls (attrs arrive with symbolic dims already evaluated to ints). Families
are sets of op names, not class trees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..types import TensorType


class ShapeError(Exception):
    """An op's operands do not fit: `rule` names the broken rule."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


def expect(cond: bool, rule: str, message: str) -> None:
    if not cond:
        raise ShapeError(rule, message)


@dataclass(frozen=True)
class OpSpec:
    name: str
    inputs: tuple[str, ...]  # "x", "b?" optional (last only), "xs*" variadic (only one)
    outputs: tuple[str, ...]  # "y"; "ys*" for a count set by attrs (see num_outputs)
    attrs: dict[str, Any]  # name -> default (REQUIRED for none)
    infer: Callable[..., list[TensorType]]
    ref: Callable[..., Any]
    doc: str = ""
    num_outputs: Callable[[dict], int] | None = None
    families: frozenset[str] = field(default_factory=frozenset)

    def arity_ok(self, n: int) -> bool:
        fixed = [i for i in self.inputs if not i.endswith(("?", "*"))]
        if any(i.endswith("*") for i in self.inputs):
            return n >= len(fixed)
        optional = sum(i.endswith("?") for i in self.inputs)
        return len(fixed) <= n <= len(fixed) + optional

    def n_outputs(self, attrs: dict) -> int:
        return self.num_outputs(attrs) if self.num_outputs else len(self.outputs)

    def full_attrs(self, attrs: dict) -> dict:
        """attrs with defaults filled in; a KeyError names a missing required one."""
        out = {}
        for k, default in self.attrs.items():
            if k in attrs:
                out[k] = attrs[k]
            elif default is REQUIRED:
                raise KeyError(k)
            else:
                out[k] = default
        return out


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

OPS: dict[str, OpSpec] = {}
FAMILIES: dict[str, set[str]] = {}


def defop(name: str, inputs: str, outputs: str = "y", *, attrs: dict | None = None,
          infer: Callable, ref: Callable, families: str = "", doc: str = "",
          num_outputs: Callable[[dict], int] | None = None) -> OpSpec:
    """Declare op `name`; `inputs`/`outputs`/`families` are space-separated names."""
    if name in OPS:
        raise ValueError(f"op {name!r} declared twice")
    spec = OpSpec(name, tuple(inputs.split()), tuple(outputs.split()), dict(attrs or {}), infer,
                  ref, doc, num_outputs, frozenset(families.split()))
    OPS[name] = spec
    for fam in spec.families:
        FAMILIES.setdefault(fam, set()).add(name)
    return spec


def family(name: str) -> frozenset[str]:
    return frozenset(FAMILIES.get(name, ()))
