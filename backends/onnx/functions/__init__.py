"""The k3c-domain ops of an ONNX artifact and their bodies (FunctionProto of standard ops).

Every body is a Python function `body(b, *inputs, **attrs) -> outputs` over a `Builder`;
attributes arrive as `Ref`s inside a FunctionProto (the caller's node sets them) or as
plain numbers when a body is inlined elsewhere (`b.param` takes either). The bodies use
standard ops only, so a model that ships them runs on any conforming ONNX runtime.

    FUNCTIONS["kda"]              the registered definition (inputs, outputs, attributes)
    function_proto("kda")         its FunctionProto, shipped inside the model

An IR op whose body is one function of its own name declares it with `@op_function("kda")`:
the signature comes from the op's spec, and the ONNX lowering of the op comes with it. Bodies
whose structure an attribute changes (an activation, a gate kind) are `@function`s under
variant names, chosen by the lowerings of custom.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
from onnx import AttributeProto
from onnx import helper as oh

from ....ir import OPS
from ....registry import Registry
from ..builder import DOMAIN, OPSET, Builder, Ref


@dataclass(frozen=True)
class FunctionDef:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, str]  # attribute name -> "float" | "int"
    body: Callable
    doc: str


# A Registry (k3c.registry): the functions of a delta-family op a user declares inside a
# `scope()` (recurrent.py makes one per member) go when the scope ends, as the op does.
FUNCTIONS: Registry = Registry("k3c function")


def function(name: str, inputs: str, outputs: str, attrs: dict[str, str] | None = None, doc: str = "",
             builtin: bool = True, replace: bool = False):
    """Register `body` as the k3c-domain op `name` (inputs/outputs: space-separated names)."""

    def register(body: Callable) -> Callable:
        FUNCTIONS.add(name, FunctionDef(name, tuple(inputs.split()), tuple(outputs.split()), dict(attrs or {}),
                                        body, doc or (body.__doc__ or "").strip().splitlines()[0]),
                      replace=replace, builtin=builtin)
        return body

    return register


def op_function(op: str, *, attrs: tuple[str, ...] | None = None):
    """Register `body` as the k3c-domain function of IR op `op` with the op's own signature
    (its tensor inputs and outputs from the spec, the attributes `attrs` names, default all of
    them), and as the op's ONNX lowering (a node of the k3c domain; cell "fn")."""
    spec = OPS[op]
    names = tuple(spec.attr_specs) if attrs is None else attrs
    kinds = {a: "int" if spec.attr_specs[a].kind == "int" else "float" for a in names}

    def register(body: Callable) -> Callable:
        function(op, " ".join(spec.tensor_inputs), " ".join(spec.outputs), kinds)(body)
        from ..custom import call_lowering

        call_lowering(op, kinds)
        return body

    return register


def definition(name: str) -> FunctionDef:
    """The registered function `name`. A delta-family member's is made with its `onnx` table
    entry (recurrent.py), which a `scope()` that ended may have taken: loading the table
    makes it again."""
    if name not in FUNCTIONS:
        from ...tables import load

        load("onnx")
    return FUNCTIONS[name]


def function_proto(name: str) -> onnx.FunctionProto:
    """The FunctionProto of op `name`: its body with attribute references to the caller's node."""
    fd = definition(name)
    b = Builder(name)
    refs = {a: Ref(a, AttributeProto.FLOAT if kind == "float" else AttributeProto.INT)
            for a, kind in fd.attrs.items()}
    outs = fd.body(b, *fd.inputs, **refs)
    outs = [outs] if isinstance(outs, str) else list(outs)
    for formal, value in zip(fd.outputs, outs):
        b.Identity(value, outputs=[formal])
    return oh.make_function(DOMAIN, name, list(fd.inputs), list(fd.outputs), b.nodes,
                            [oh.make_opsetid("", OPSET)], list(fd.attrs), doc_string=fd.doc)


def inline(b: Builder, name: str, inputs: list[str], **attrs) -> list[str]:
    """Emit op `name`'s body straight into `b` (attrs as numbers or Refs); returns its outputs."""
    outs = definition(name).body(b, *inputs, **attrs)
    return [outs] if isinstance(outs, str) else list(outs)


from . import attention, chunked, conv, mlp, recurrent  # noqa: E402,F401  (register the bodies)

__all__ = ["FUNCTIONS", "FunctionDef", "definition", "function", "function_proto", "inline"]
