"""Triton's chunked delta rule (interpreter, tiny shapes) at the numerical edges
(tests/edge_decays.py: spiky gates, one step of -70, an erased state) against the float64
recurrence: the cumulative gates are float64, so no decay between tokens cancels."""

from __future__ import annotations

import pytest
from edge_decays import EDGES, SCALE, check_edge, edge_case

from k3c.kernels.delta.triton import chunk_delta

CASES = [(e, "channel") for e in EDGES] + [("spiky", "head")]


@pytest.mark.parametrize("edge,gate", CASES, ids=[f"{e}-{g}" for e, g in CASES])
def test_chunk_exact_at_the_edges(edge, gate):
    x = edge_case(edge, gate, H=1, K=16, V=8)
    o, S = chunk_delta(*x.args()[:5], gate=gate, scale=SCALE, initial_state=x.state, chunk_size=32)
    check_edge(o, S, x, f"triton {gate} {edge}")
