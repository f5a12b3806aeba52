"""What a compiled entry accepts, read from its graph: the checks every runner without a
manifest of its own (reference, triton) makes before it runs.

- the inputs fit the graph's types and its dims' ranges (`k3c.ir.bind_dims`: the count, dtypes,
  shapes, and bounds such as GPT-2's position table, recorded in `graph.dims` at capture);
- token ids lie inside the embedding table they index (the vocabulary);
- log-decays fed as graph inputs are <= 0 where the backend's kernels assume it (signs.py).

The ONNX and TVM runners check the same against their manifests, which record both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InputError
from ..ir import Graph, bind_dims


def id_bounds(graph: Graph) -> dict[str, int]:
    """Integer inputs that index an embedding table -> the number of rows of that table."""
    out = {}
    for node in graph.nodes:
        if node.op == "embedding" and node.inputs[1] in graph.inputs:
            rows = graph.types[node.inputs[0]].shape[0]
            if isinstance(rows, int):
                out[node.inputs[1]] = rows
    return out


def check_ids(name: str, x: torch.Tensor, rows: int) -> None:
    if x.is_meta or not x.numel():
        return
    bad = (x < 0) | (x >= rows)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        raise InputError(f"input {name!r}: id {int(x[tuple(where)])} at {where} is outside [0, {rows})")


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32)


def value_range(x: torch.Tensor) -> tuple[float, float]:
    """(min, max) of a non-empty tensor, for a CPU tensor on the calling thread alone (numpy's
    reductions): a runner checks its inputs right after its last call, while that call's
    thread pool may still be spinning, and a reduction parallel over torch's threads then
    waits for the thread that lost its core (a log-decay [1, 2048, 4, 64] checked by torch
    right after a TVM call: 7.6 ms, against 0.07 ms on an idle machine)."""
    if x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES:
        a = x.detach().numpy()
        return a.min().item(), a.max().item()
    return x.min().item(), x.max().item()


def check_nonpositive(name: str, x: torch.Tensor, backend: str) -> None:
    if x.is_meta or not x.numel():
        return
    top = value_range(x)[1]
    if top > 0:
        raise InputError(f"input {name!r} is a log-decay and must be <= 0 for the {backend} kernels "
                         f"(they clamp each exponent at 0); it reaches {top:.3g}")


def check_inputs(graph: Graph, inputs: Sequence[torch.Tensor], nonpositive: Sequence[str] = (),
                 backend: str = "") -> dict[str, int]:
    """Bind the dims of `graph` from `inputs` or raise an InputError naming the misfit; the
    inputs named in `nonpositive` (log-decays of kernels that assume g <= 0) are checked too."""
    env = bind_dims(graph, inputs)
    for name, rows in id_bounds(graph).items():
        check_ids(name, inputs[graph.inputs.index(name)], rows)
    for name in nonpositive:
        check_nonpositive(name, inputs[graph.inputs.index(name)], backend)
    return env
