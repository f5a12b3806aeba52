"""What the chunk kernels share: the gate kinds and the floored decay."""

from __future__ import annotations

from tvm.script import tirx as T

from ...common.tvm import exp_vec
from ...delta_chunk import EXP_FLOOR

GATES = ("channel", "head", "none", "linear")


def _check(gate: str) -> None:
    if gate not in GATES:
        raise ValueError(f"chunk gate must be one of {GATES}, got {gate!r}")


def _decay(x):
    """exp(max(x, EXP_FLOOR)) for a log-decay x <= 0 (an exp that stays in vectors)."""
    return exp_vec(T.max(x, T.float32(EXP_FLOOR)))
