"""The verifier: names the node, the broken rule and the user's source line.

Rules: unknown-op, arity, attr (unknown, missing, mistyped or out-of-range attributes),
undefined-value, redefined-value, undeclared-dim,
type-mismatch, undefined-output, plus each op's own shape rules (state-shape, qkv-shape, ...).
"""

from __future__ import annotations

from ..errors import VerifyError
from . import dims as D
from .graph import Graph, Node
from .ops import OPS, ShapeError


def verify(graph: Graph) -> Graph:
    """Check `graph`; return it unchanged or raise VerifyError."""
    declared = set(graph.dims)

    def check_dims(name: str, node: Node | None = None) -> None:
        for d in graph.types[name].shape:
            unknown = D.symbols_of(d) - declared
            if unknown:
                raise VerifyError("undeclared-dim", f"value %{name} uses undeclared dim(s) {sorted(unknown)}", node)

    defined: set[str] = set()
    for name in list(graph.inputs) + list(graph.weights):
        if name not in graph.types:
            raise VerifyError("undefined-value", f"input or weight %{name} has no type")
        if name in defined:
            raise VerifyError("redefined-value", f"%{name} is declared twice")
        check_dims(name)
        defined.add(name)
    for name, t in graph.weights.items():
        wtype = graph.types[name]
        if tuple(t.shape) != wtype.shape or t.dtype != wtype.torch_dtype:
            raise VerifyError("type-mismatch", f"weight %{name} holds {t.dtype} {list(t.shape)}, declared {wtype}")
    for node in graph.nodes:
        _verify_node(graph, node, defined)
        for o in node.outputs:
            check_dims(o, node)
            defined.add(o)
    for out, value in graph.outputs:
        if value not in defined:
            raise VerifyError("undefined-output", f"output {out!r} refers to undefined value %{value}")
    return graph


def _verify_node(graph: Graph, node: Node, defined: set[str]) -> None:
    spec = OPS.get(node.op)
    if spec is None:
        raise VerifyError("unknown-op", f"op {node.op!r} is not declared", node)
    if not spec.arity_ok(len(node.inputs)):
        raise VerifyError("arity", f"{node.op} takes inputs ({', '.join(spec.inputs)}), got {len(node.inputs)}", node)
    for i in node.inputs:
        if i not in defined:
            raise VerifyError("undefined-value", f"input %{i} is not defined before use", node)
    for o in node.outputs:
        if o in defined:
            raise VerifyError("redefined-value", f"%{o} is defined twice", node)
        if o not in graph.types:
            raise VerifyError("undefined-value", f"output %{o} has no declared type", node)
    key = _typing_key(graph, node)
    if key is not None and key in _TYPED:
        return
    problems = spec.attr_problems(node.attrs)
    if problems:
        raise VerifyError("attr", "; ".join(problems), node)
    attrs = spec.full_attrs(node.attrs)
    try:
        inferred = spec.infer(*[graph.types[i] for i in node.inputs], **attrs)
    except ShapeError as e:
        raise VerifyError(e.rule, str(e), node) from None
    if len(inferred) != len(node.outputs):
        raise VerifyError("arity", f"{node.op} yields {len(inferred)} outputs, node names {len(node.outputs)}", node)
    for o, t in zip(node.outputs, inferred):
        declared = graph.types[o]
        if not declared.same_as(t):
            raise VerifyError("type-mismatch", f"output %{o} is declared {declared}, but {node.op} gives {t}", node)
    if key is not None:
        if len(_TYPED) > 100_000:
            _TYPED.clear()
        _TYPED.add(key)


# The typings that passed: an op, its attributes, its input types and its outputs' declared
# types. Inference is a pure function of the first three, so a node whose key passed once
# passes again: a pipeline verifies after every pass, and most nodes are as they were.
_TYPED: set = set()


def _typing_key(graph: Graph, node: Node):
    try:
        return (node.op, _frozen(node.attrs), tuple(graph.types[i] for i in node.inputs),
                tuple(graph.types[o] for o in node.outputs))
    except TypeError:  # an attribute that cannot be hashed: checked every time
        return None


def _frozen(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_frozen(v) for v in value))
    hash(value)
    return (type(value).__name__, value)
