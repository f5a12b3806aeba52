"""What the chunk kernels share: the gate kinds and the decays.

The cumulative gates G of a chunk are kept in float64 (a kernel's running sum and the G buffer
between kernels): every decay between two tokens is a difference of them, which in float32
cancels after a strong decay earlier in the chunk (|G| ~ 1e3: an absolute error of ulp(|G|),
6e-5), while in float64 it is exact to float32. Each difference is rounded once to float32
before its exp."""

from __future__ import annotations

from tvm.script import tirx as T

from ...common.tvm import exp_vec
from .. import GATES  # the family's gate kinds (kernels/delta)


def _check(gate: str) -> None:
    if gate not in GATES:
        raise ValueError(f"chunk gate must be one of {GATES}, got {gate!r}")


def _decay_of(G):
    """exp(G) for a float64 cumulative gate G <= 0 (an exp that stays in vectors), floored at
    exp(-87) = 1.6e-38 by exp_vec's clamp, as k3c.kernels.delta.chunk's LOG_FLOOR."""
    return exp_vec(T.Cast("float32", G))


def _decay_between(G_i, G_j):
    """exp(G_i - G_j) for float64 cumulative gates, the difference taken in float64. It is <= 0
    wherever a kernel keeps it (j <= i: a cumsum of gates <= 0 never grows, in floats too);
    pairs j > i reach at most exp_vec's clamp, e^88, and are selected away."""
    return exp_vec(T.Cast("float32", G_i - G_j))
