"""The interpreter: runs any graph with each op's naive reference. The oracle of k3c."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy
import torch

from ..errors import InputError
from . import dims as D
from .graph import Graph, Node
from .ops import OPS


def bind_dims(graph: Graph, inputs: Sequence[torch.Tensor]) -> dict[str, int]:
    """Values of the symbolic dims from the inputs; an InputError names a misfit input."""
    if len(inputs) != len(graph.inputs):
        raise InputError(f"{graph.name} takes {len(graph.inputs)} inputs ({', '.join(graph.inputs)}), "
                         f"got {len(inputs)}")
    env: dict[str, int] = {}
    for name, x in zip(graph.inputs, inputs):
        t = graph.types[name]
        if not isinstance(x, torch.Tensor) or x.dim() != t.rank or x.dtype != t.torch_dtype:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise InputError(f"input {name!r}: expected {t}, got {got}")
        for d in t.shape:
            if isinstance(d, sympy.Symbol):
                env.setdefault(d.name, int(x.shape[t.shape.index(d)]))
    for name, x in zip(graph.inputs, inputs):
        t = graph.types[name]
        for axis, d in enumerate(t.shape):
            want = D.evaluate(d, env)
            if int(x.shape[axis]) != want:
                raise InputError(f"input {name!r}: expected {t}, got {list(x.shape)} "
                                 f"(dim {axis} is {x.shape[axis]}, expected {want})")
    for n, (lo, hi) in graph.dims.items():
        if n in env and (env[n] < lo or (hi is not None and env[n] > hi)):
            raise InputError(f"dim {n} = {env[n]} is outside its range [{lo}, {hi if hi is not None else 'inf'}]")
    return env


def resolve(value, env: dict[str, int]):
    """Evaluate the symbolic dims inside an attribute value."""
    if isinstance(value, sympy.Basic):
        return D.evaluate(value, env)
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    return value


def run_node(node: Node, args: list[torch.Tensor], env: dict[str, int]) -> tuple[torch.Tensor, ...]:
    spec = OPS[node.op]
    attrs = {k: resolve(v, env) for k, v in spec.full_attrs(node.attrs).items()}
    out = spec.ref(*args, **attrs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _check_weights_have_data(graph: Graph, inputs: Sequence[torch.Tensor]) -> None:
    """Real inputs need real weights: an op given a data-less (meta) weight beside real data
    returns uninitialised memory, a silently wrong answer. Meta inputs (shape-only runs) pass."""
    if all(x.is_meta for x in inputs) and inputs:
        return
    empty = [w for w, t in graph.weights.items() if t.is_meta]
    if empty:
        more = f" and {len(empty) - 3} more" if len(empty) > 3 else ""
        raise InputError(f"{graph.name}: weight {', '.join('%' + w for w in empty[:3])}{more} carries no data "
                         f"(the IR text form holds weight types only); bind real tensors in graph.weights "
                         f"or load the graph with its weights file")


@torch.no_grad()
def interpret(graph: Graph, *inputs: torch.Tensor,
              observe: Callable[[Node, tuple[torch.Tensor, ...]], None] | None = None) -> list[torch.Tensor]:
    """Run `graph` on `inputs`; returns its outputs in order. `observe(node, outs)` sees each step."""
    env = bind_dims(graph, inputs)
    _check_weights_have_data(graph, inputs)
    values: dict[str, torch.Tensor] = dict(graph.weights)
    values.update(zip(graph.inputs, inputs))
    for node in graph.nodes:
        outs = run_node(node, [values[i] for i in node.inputs], env)
        values.update(zip(node.outputs, outs))
        if observe is not None:
            observe(node, outs)
    return [values[v] for v in graph.output_values]
