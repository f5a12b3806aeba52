"""What a compiled entry accepts, read from its graph: the checks every runner without a
manifest of its own (reference, triton) makes before it runs.

- the inputs fit the graph's types and its dims' ranges (`k3c.ir.bind_dims`: the count, dtypes,
  shapes, and bounds such as GPT-2's position table, recorded in `graph.dims` at capture);
- token ids lie inside the embedding table they index (the vocabulary);
- a fixed-capacity cache's `positions` leave room for the new tokens (0 <= p, p + T <= N) and
  a ragged prefill's `lengths` lie in [1, T]: the in-place cache writes of the native backends
  index memory with them and check nothing themselves (TVM wrote past its cache with a position
  of 100000 and freed memory twice with -1);
- log-decays fed as graph inputs are <= 0 where the backend's kernels assume it (signs.py).

`limits(graph)` is what an entry's integer inputs index; `seal` records it in every manifest,
and `check_limits` is the one check of it that every runner (reference, onnx, tvm, triton)
makes, whichever entry is called, before native code sees the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..errors import InputError
from ..ir import Graph, bind_dims, named_inputs


def id_bounds(graph: Graph) -> dict[str, int]:
    """Integer inputs that index an embedding table -> the number of rows of that table."""
    out = {}
    for node in (n for n in graph.nodes if n.op == "embedding"):
        x = named_inputs(node)
        if x["ids"] in graph.inputs:
            rows = graph.types[x["weight"]].shape[0]
            if isinstance(rows, int):
                out[x["ids"]] = rows
    return out


POSITIONS, LENGTHS = "positions", "lengths"  # the serving inputs' names (k3c/serving.py)


def limits(graph: Graph) -> dict:
    """What the integer inputs of `graph` index: {"ids": {input: vocabulary rows},
    "positions": {input: [capacity, token input]}, "lengths": {input: [least, token input]}};
    the token input (input_ids [B, T]) gives T, the rows one call adds. A prefill's lengths
    are at least 1 (its last real row is read), an extend's at least 0 (a row may add nothing)."""
    ids = id_bounds(graph)
    tokens = next(iter(ids), graph.inputs[0] if graph.inputs else None)
    out: dict = {"ids": ids, "positions": {}, "lengths": {}}
    capacity = graph.meta.get("max_context")
    if POSITIONS in graph.inputs and tokens is not None and type(capacity) is int and capacity > 0:
        out["positions"][POSITIONS] = [capacity, tokens]
    if LENGTHS in graph.inputs and tokens is not None:
        out["lengths"][LENGTHS] = [0 if POSITIONS in graph.inputs else 1, tokens]
    return out


def _range(x) -> tuple[int, int] | None:
    """(min, max) of an integer tensor or array, None when empty (nothing to check)."""
    if isinstance(x, np.ndarray):
        return (int(x.min()), int(x.max())) if x.size else None
    if x.is_meta or not x.numel():
        return None
    lo, hi = value_range(x)
    return int(lo), int(hi)


def check_limits(entry: str, limits: Mapping, names: Sequence[str], inputs: Sequence) -> None:
    """Raise an InputError when an id, position or length of `inputs` (tensors or arrays,
    named `names`) falls outside what `limits` says the entry's kernels may index."""
    def value(name: str):
        return inputs[names.index(name)]

    for name, rows in limits.get("ids", {}).items():
        r = _range(value(name))
        if r and (r[0] < 0 or r[1] >= rows):
            bad = r[0] if r[0] < 0 else r[1]
            raise InputError(f"{entry} input {name!r}: id {bad} is outside [0, {rows}) (the vocabulary)")
    for name, (capacity, tokens) in limits.get("positions", {}).items():
        T, r = int(value(tokens).shape[1]), _range(value(name))
        if r and r[0] < 0:
            raise InputError(f"{entry} input {name!r}: position {r[0]} is negative")
        if r and r[1] + T > capacity:
            raise InputError(f"{entry} input {name!r}: a sequence holds {r[1]} tokens and {T} more do not fit "
                             f"the caches' {capacity} rows (prefill again or compile with a larger max_context)")
    for name, (least, tokens) in limits.get("lengths", {}).items():
        T, r = int(value(tokens).shape[1]), _range(value(name))
        if r and (r[0] < least or r[1] > T):
            raise InputError(f"{entry} input {name!r}: length {r[0] if r[0] < least else r[1]} is outside "
                             f"[{least}, {T}] (T = {T} tokens a row)")


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
    check_limits(graph.meta.get("entry", "the graph"), limits(graph), graph.inputs, inputs)
    for name in nonpositive:
        check_nonpositive(name, inputs[graph.inputs.index(name)], backend)
    return env
