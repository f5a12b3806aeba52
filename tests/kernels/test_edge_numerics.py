"""The eager chunked delta rule at the numerical edges (tests/edge_decays.py) against the
float64 recurrence: exact after strong decays, no floor that keeps an erased state, a NaN
that stays where the recurrence puts it, and a float64 yardstick that is float64."""

from __future__ import annotations

import pytest
import torch
from edge_decays import EDGES, SCALE, check_edge, edge_case, one_step_case, recurrence_f64

from k3c.kernels import gated_delta_rule, kda
from k3c.kernels.kda import naive_recurrent_kda
from k3c.numerics import assert_close

OPS = {"channel": kda, "head": gated_delta_rule}


@pytest.mark.parametrize("C", [16, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("gate", ["channel", "head"])
@pytest.mark.parametrize("edge", EDGES)
def test_chunked_exact_at_the_edges(edge, gate, C):
    x = edge_case(edge, gate)
    o, S = OPS[gate](*x.args()[:5], scale=SCALE, initial_state=x.state, chunk_size=C)
    check_edge(o, S, x, f"{gate} chunked C={C} {edge}")


def test_one_step_of_minus_70():
    """A single step of g = -70 (T = 1): the decayed state and the write, exactly."""
    x = one_step_case()
    assert (x.g == -70).all()
    o, S = kda(*x.args()[:5], scale=SCALE, initial_state=x.state, chunk_size=64)
    check_edge(o, S, x, "one step of g = -70")


@pytest.mark.parametrize("where", ["v", "k", "g", "beta"])
def test_nan_stays_at_and_after_its_token(where):
    """A NaN at token t of a chunk: outputs before t are those of the same inputs without it
    (the masked products 0 * NaN must not carry it backwards), from t on NaN as in the
    recurrence."""
    x = edge_case("one-step", "channel", T=40)
    t = 23
    args = [a.clone() for a in x.args()[:5]]
    i = "q k v g beta".split().index(where)
    args[i][:, t] = float("nan")
    o, S = kda(*args, scale=SCALE, initial_state=x.state, chunk_size=64)
    o_clean, _ = kda(*x.args()[:5], scale=SCALE, initial_state=x.state, chunk_size=64)
    o_rec, _ = kda(*args, scale=SCALE, initial_state=x.state)  # the recurrence
    assert torch.isfinite(o[:, :t]).all(), "a NaN reached tokens before its own"
    assert_close(o[:, :t], o_clean[:, :t], what="outputs before the NaN")
    assert torch.equal(torch.isnan(o[:, t:]), torch.isnan(o_rec[:, t:]))


def test_float64_yardstick_is_float64():
    """fp64 inputs: the recurrence and the chunked form both compute in fp64 (the yardstick of
    a stress run), equal to the float64 definition at the fp64 row."""
    x = edge_case("spiky", "channel")
    args = [a.double() for a in x.args()]
    o_ref, S_ref = recurrence_f64(*args[:5], SCALE, args[5])
    o, S = naive_recurrent_kda(*args[:5], SCALE, args[5])
    assert o.dtype == S.dtype == torch.float64
    assert_close(o, o_ref, what="fp64 recurrence output")
    oc, Sc = kda(*args[:5], scale=SCALE, initial_state=args[5], chunk_size=16)
    assert oc.dtype == Sc.dtype == torch.float64
    assert_close(oc, o_ref, what="fp64 chunked output")
    assert_close(Sc, S_ref, what="fp64 chunked final state")
