"""KDA's Triton kernels under the interpreter against the naive definitions: the chunked
prefill (all three pieces, and each piece against its IR op's reference), the fused
recurrent step, the gated delta rule and delta rule variants, strong decay, split/resume."""

from __future__ import annotations

import pytest
import torch
from triton_inputs import DTYPES, HEAD_DIMS, Delta, delta

from k3c.ir import OPS
from k3c.kernels.delta.triton import chunk_delta, chunk_output, chunk_prepare, chunk_state_scan, fused_recurrent
from k3c.kernels.delta_rule.naive import naive_recurrent_delta_rule
from k3c.kernels.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
from k3c.kernels.kda.naive import naive_recurrent_kda
from k3c.numerics import assert_close

SCALE = 0.25


def reference(x: Delta, gate: str):
    """(o, final state) of the recurrent definition on fp32 copies of the inputs."""
    r = x.upcast()
    if gate == "channel":
        return naive_recurrent_kda(r.q, r.k, r.v, r.g, r.beta, SCALE, r.state)
    if gate == "head":
        return naive_recurrent_gated_delta_rule(r.q, r.k, r.v, r.g, r.beta, SCALE, r.state)
    return naive_recurrent_delta_rule(r.q, r.k, r.v, r.beta, SCALE, r.state)


def check(actual, x: Delta, gate: str, what: str) -> None:
    (o, S), (o_ref, S_ref) = actual, reference(x, gate)
    assert o.dtype == x.v.dtype and S.dtype == torch.float32
    assert_close(o, o_ref.to(o.dtype), dtype=o.dtype, what=f"{what} output")
    assert_close(S, S_ref, what=f"{what} final state")  # fp32 from the same values: the fp32 row


def pairwise() -> list:
    """(T, K, dtype) cases where every pair of values of two of them occurs: all of T = 1, and
    for T = 63 and 65 a Latin square of head dims and dtypes (half the slow cases)."""
    f32, f16 = DTYPES
    cases = [(1, K, dt) for K in HEAD_DIMS for dt in DTYPES]
    cases += [(63, 32, f32), (63, 48, f16), (65, 32, f16), (65, 48, f32)]
    return [pytest.param(T, K, dt, id=f"T{T}-K{K}-{str(dt).removeprefix('torch.')}") for T, K, dt in cases]


CASES = pytest.mark.parametrize("T,K,dtype", pairwise())


@CASES
def test_chunk_kda_equals_recurrent_definition(T, K, dtype):
    x = delta(T, K, dtype=dtype)
    check(chunk_delta(x.q, x.k, x.v, x.g, x.beta, gate="channel", scale=SCALE, initial_state=x.state), x, "channel",
          "chunk_kda")


@CASES
def test_fused_recurrent_kda_equals_definition(T, K, dtype):
    x = delta(T, K, dtype=dtype, seed=1)
    check(fused_recurrent(x.q, x.k, x.v, x.g, x.beta, SCALE, x.state, gate="channel"), x, "channel", "fused_recurrent")


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
@pytest.mark.parametrize("gate", ["head", "none"], ids=["gated-delta-rule", "delta-rule"])
@pytest.mark.parametrize("T", [1, 65], ids=lambda t: f"T{t}")
def test_delta_family_variants(T, gate, form):
    x = delta(T, 48, 32, gate=gate, seed=2)
    if form == "chunk":
        out = chunk_delta(x.q, x.k, x.v, x.g, x.beta, gate=gate, scale=SCALE, initial_state=x.state)
    else:
        out = fused_recurrent(x.q, x.k, x.v, x.g, x.beta, SCALE, x.state, gate=gate)
    check(out, x, gate, f"{gate} {form}")


@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"C{c}")
def test_strong_decay_stays_finite_and_exact(chunk_size):
    """Gates of -5 to -25 per step: exp(G_i - G_j) spans e^-1600 within a chunk; factoring
    it as exp(G_i) exp(-G_j) would overflow. Every factor the kernels form is <= 1."""
    x = delta(65, 32, gate="channel", strong=True, seed=3)
    check(chunk_delta(x.q, x.k, x.v, x.g, x.beta, gate="channel", scale=SCALE, initial_state=x.state,
                      chunk_size=chunk_size),
          x, "channel", "strong decay")


def test_split_resume_equals_one_call():
    x = delta(65, 32, gate="channel", seed=4)
    o1, S1 = chunk_delta(x.q[:, :40], x.k[:, :40], x.v[:, :40], x.g[:, :40], x.beta[:, :40], gate="channel",
                         scale=SCALE, initial_state=x.state)
    y = x.cut(40, 65, S1)
    o2, S2 = fused_recurrent(y.q, y.k, y.v, y.g, y.beta, SCALE, y.state, gate="channel")
    check((torch.cat([o1, o2], 1), S2), x, "channel", "chunk then recurrent")


@pytest.mark.parametrize("gate", ["channel", "head", "none", "linear"])
def test_each_piece_equals_its_ir_reference(gate):
    """(a), (b), (c) one by one against the references of chunk_prepare, chunk_state_scan and
    chunk_output (k3c.kernels.delta.chunk), fed the reference's own inputs."""
    x = delta(65, 48, 32, gate="none" if gate == "linear" else gate, seed=5)
    beta = None if gate == "linear" else x.beta
    args = [x.q, x.k, x.v] + ([] if gate == "linear" else [beta]) + ([x.g] if x.g is not None else [])
    ref = OPS["chunk_prepare"].ref(*args, chunk_size=16, gate=gate)
    got = chunk_prepare(x.q, x.k, x.v, beta, x.g, 16, gate)
    for name, a, b in zip(("q_decayed", "k_decayed", "w", "u", "aqk", "decay_last"), got, ref):
        assert a.shape == b.shape, name
        assert_close(a, b, what=f"chunk_prepare {name}")
    q_dec, k_dec, w, u, aqk, decay = ref
    scan_ref = OPS["chunk_state_scan"].ref(w, u, k_dec, decay, x.state)
    for name, a, b in zip(("v_new", "start_states", "final state"), chunk_state_scan(w, u, k_dec, decay, x.state),
                          scan_ref):
        assert_close(a, b, what=f"chunk_state_scan {name}")
    o_ref = OPS["chunk_output"].ref(q_dec, aqk, scan_ref[0], scan_ref[1], scale=SCALE, T=65)
    assert_close(chunk_output(q_dec, aqk, scan_ref[0], scan_ref[1], SCALE, 65), o_ref, what="chunk_output")


def test_chunk_size_must_suit_the_kernels():
    x = delta(8, 32)
    with pytest.raises(ValueError, match="power of two >= 16"):
        chunk_prepare(x.q, x.k, x.v, x.beta, x.g, 24, "channel")
