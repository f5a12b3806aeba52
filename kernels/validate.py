"""The contract of the public kernel entry points, checked once before either path runs.

`k3c.kernels.kda`, `gated_delta_rule`, `delta_rule`, `linear_attention` and `short_conv`
call these checks first, so the recurrent definition and the chunked form accept exactly the
same inputs: fla's `[B, T, H, K]` layout, floating-point tensors on one device, a state
`[B, H, K, V]`, a positive int `chunk_size`. A misfit is an `InputError` that names the
argument, the shape it has and the shape it should have. T = 0 and B = 0 are valid (nothing
to compute: the output is empty and the state is the initial one).
"""

from __future__ import annotations

import math

import torch

from .. import errors


def _fail(op: str, message: str):
    raise errors.InputError(f"k3c.kernels.{op}: {message}")


def _shape(x: torch.Tensor) -> str:
    return f"[{', '.join(str(d) for d in x.shape)}]"


def _tensor(op: str, name: str, x, rank: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        _fail(op, f"{name} must be a tensor {layout}, got {type(x).__name__}")
    if x.dim() != rank:
        _fail(op, f"{name} must be {layout} (rank {rank}), got shape {_shape(x)}")
    if not x.is_floating_point():
        _fail(op, f"{name} must be floating point, got {x.dtype}")
    return x


def _expect(op: str, name: str, x: torch.Tensor, want: tuple[int, ...], layout: str) -> None:
    if tuple(x.shape) != want:
        _fail(op, f"{name} must be {layout} = [{', '.join(map(str, want))}], got {_shape(x)}")


def check_chunk_size(op: str, chunk_size) -> None:
    if chunk_size is None:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        _fail(op, f"chunk_size must be None (recurrent) or a positive int, got {chunk_size!r}")


def check_scale(op: str, scale) -> None:
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        _fail(op, f"scale must be None or a finite number, got {scale!r}")


def _same_device(op: str, named: dict[str, torch.Tensor | None]) -> None:
    devices = {n: x.device for n, x in named.items() if x is not None}
    if len(set(devices.values())) > 1:
        _fail(op, "inputs on different devices: " + ", ".join(f"{n} on {d}" for n, d in devices.items()))


def check_delta_rule(op: str, q, k, v, g, beta, initial_state, scale, chunk_size, gate: str | None) -> None:
    """The delta-rule family: q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H], state
    [B, H, K, V]; g per channel [B, T, H, K] (gate "channel"), per head [B, T, H] ("head")
    or absent (None)."""
    q = _tensor(op, "q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    _expect(op, "k", _tensor(op, "k", k, 4, "[B, T, H, K]"), (B, T, H, K), "[B, T, H, K]")
    v = _tensor(op, "v", v, 4, "[B, T, H, V]")
    V = v.shape[-1]
    _expect(op, "v", v, (B, T, H, V), "[B, T, H, V]")
    if gate == "channel":
        _expect(op, "g", _tensor(op, "g", g, 4, "[B, T, H, K]"), (B, T, H, K), "[B, T, H, K]")
    elif gate == "head":
        _expect(op, "g", _tensor(op, "g", g, 3, "[B, T, H]"), (B, T, H), "[B, T, H]")
    if beta is not None:
        _expect(op, "beta", _tensor(op, "beta", beta, 3, "[B, T, H]"), (B, T, H), "[B, T, H]")
    if initial_state is not None:
        S = _tensor(op, "initial_state", initial_state, 4, "[B, H, K, V]")
        _expect(op, "initial_state", S, (B, H, K, V), "[B, H, K, V]")
    _same_device(op, {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state})
    check_scale(op, scale)
    check_chunk_size(op, chunk_size)


def check_linear_attention(q, k, v, initial_state, scale, chunk_size) -> None:
    """q, k [B, T, H, K], v [B, T, H, V], initial_state (S [B, H, K, V], z [B, H, K])."""
    op = "linear_attention"
    check_delta_rule(op, q, k, v, None, None, None, scale, chunk_size, gate=None)
    if initial_state is None:
        return
    if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
        _fail(op, "initial_state must be a pair (S [B, H, K, V], z [B, H, K])")
    B, _, H, K = q.shape
    S, z = initial_state
    _expect(op, "initial_state[0] (S)", _tensor(op, "S", S, 4, "[B, H, K, V]"), (B, H, K, v.shape[-1]),
            "[B, H, K, V]")
    _expect(op, "initial_state[1] (z)", _tensor(op, "z", z, 3, "[B, H, K]"), (B, H, K), "[B, H, K]")


def check_short_conv(x, weight, state, activation) -> None:
    """x [B, T, C], weight [C, W] (W >= 1), state [B, C, W - 1]."""
    op = "short_conv"
    x = _tensor(op, "x", x, 3, "[B, T, C]")
    weight = _tensor(op, "weight", weight, 2, "[C, W]")
    B, _, C = x.shape
    W = weight.shape[-1]
    if weight.shape[0] != C or W < 1:
        _fail(op, f"weight must be [C, W] = [{C}, W >= 1], got {_shape(weight)}")
    if state is not None:
        _expect(op, "state", _tensor(op, "state", state, 3, "[B, C, W - 1]"), (B, C, W - 1), "[B, C, W - 1]")
    if activation not in (None, "none", "silu"):
        _fail(op, f"activation must be None or 'silu', got {activation!r}")
    _same_device(op, {"x": x, "weight": weight, "state": state})


def nothing_to_compute(q: torch.Tensor) -> bool:
    """T = 0 or B = 0: the recurrent definition's empty loop is the answer for both paths."""
    return q.shape[0] == 0 or q.shape[1] == 0
