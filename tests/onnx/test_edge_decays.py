"""The ONNX chunked delta rule at the numerical edges (tests/edge_decays.py: spiky gates, one
step of -70, an erased state) against the float64 recurrence, both flavours and onnx's
reference evaluator for the portable bodies."""

from __future__ import annotations

import pytest
from edge_decays import EDGES, SCALE, check_edge, edge_case, one_step_case
from onnx_cases import B_, T_, f32, op_graph, run_ort, run_reference_evaluator


def edge_graph(op: str, x):
    B, T, H, K = x.q.shape
    V = x.v.shape[-1]
    g_type = f32(B_, T_, H, K) if op == "kda" else f32(B_, T_, H)
    ins = [("q", f32(B_, T_, H, K)), ("k", f32(B_, T_, H, K)), ("v", f32(B_, T_, H, V)), ("g", g_type),
           ("beta", f32(B_, T_, H)), ("S", f32(B_, H, K, V))]
    return op_graph(op, ins, {"scale": SCALE})


@pytest.mark.parametrize("C", [16, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("op", ["kda", "gated_delta_rule"])
@pytest.mark.parametrize("edge", EDGES)
def test_portable_exact_at_the_edges(edge, op, C):
    x = edge_case(edge, "channel" if op == "kda" else "head")
    o, S = run_ort(edge_graph(op, x), x.args(), "portable", chunk_size=C)
    check_edge(o, S, x, f"portable {op} C={C} {edge}")


@pytest.mark.parametrize("edge", EDGES)
def test_ort_flavour_and_reference_evaluator_at_the_edges(edge):
    x = edge_case(edge, "channel")
    o, S = run_ort(edge_graph("kda", x), x.args(), "ort", chunk_size=64)
    check_edge(o, S, x, f"ort flavour {edge}")
    o, S = run_reference_evaluator(edge_graph("kda", x), x.args(), chunk_size=64)
    check_edge(o, S, x, f"onnx reference evaluator {edge}")


@pytest.mark.parametrize("flavour", ["portable", "ort"])
def test_one_step_of_minus_70(flavour):
    """T = 1 with g = -70: a prefill of one token through the chunked pieces."""
    x = one_step_case()
    o, S = run_ort(edge_graph("kda", x), x.args(), flavour, chunk_size=64)
    check_edge(o, S, x, f"{flavour} one step of g = -70")
