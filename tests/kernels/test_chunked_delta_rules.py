"""The chunked (WY/UT) forms equal the recurrent definitions: KDA, the gated delta rule, the
delta rule and linear attention, at awkward lengths, with carried state, under strong decay."""

from __future__ import annotations

import pytest
import torch
from kernel_inputs import DeltaInputs, delta_inputs, kda_strong_gates, linear_inputs

from k3c.kernels import delta_rule, gated_delta_rule, kda, linear_attention
from k3c.numerics import assert_close

GATES = {"kda": "channel", "gated_delta_rule": "head", "delta_rule": None}
LENGTHS = [1, 63, 64, 65, 130]
CHUNKS = [16, 64]


def run(op: str, x: DeltaInputs, chunk_size: int | None, state: torch.Tensor | None = None):
    """(o, final state) of `op` on x; chunk_size None is the recurrent definition."""
    state = x.state if state is None else state
    kw = dict(initial_state=state, chunk_size=chunk_size)
    if op == "kda":
        return kda(x.q, x.k, x.v, x.g, x.beta, **kw)
    if op == "gated_delta_rule":
        return gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, **kw)
    return delta_rule(x.q, x.k, x.v, x.beta, **kw)


def assert_same(actual, expected, what: str) -> None:
    (o, S), (o_ref, S_ref) = actual, expected
    assert o.dtype == o_ref.dtype and S.dtype == torch.float32
    assert_close(o, o_ref, what=f"{what} output")
    assert_close(S, S_ref, what=f"{what} final state")


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "state"])
@pytest.mark.parametrize("C", CHUNKS, ids=lambda c: f"C{c}")
@pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")
@pytest.mark.parametrize("op", list(GATES))
def test_chunked_equals_recurrent(op, T, C, with_state):
    x = delta_inputs(T, gate=GATES[op], with_state=with_state)
    assert_same(run(op, x, C), run(op, x, None), f"{op} T={T} C={C}")


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "state"])
@pytest.mark.parametrize("C", CHUNKS, ids=lambda c: f"C{c}")
@pytest.mark.parametrize("T", LENGTHS, ids=lambda t: f"T{t}")
def test_linear_attention_chunked_equals_recurrent(T, C, with_state):
    q, k, v, state = linear_inputs(T, with_state=with_state)
    o, (S, z) = linear_attention(q, k, v, initial_state=state, chunk_size=C)
    o_ref, (S_ref, z_ref) = linear_attention(q, k, v, initial_state=state)
    assert_close(o, o_ref, what="output")
    assert_close(S, S_ref, what="S")
    assert_close(z, z_ref, what="z")


SPLITS = [("chunk", "chunk"), ("recurrent", "chunk"), ("chunk", "recurrent")]


@pytest.mark.parametrize("first,second", SPLITS, ids=[f"{a}-then-{b}" for a, b in SPLITS])
@pytest.mark.parametrize("s", [1, 64, 77], ids=lambda s: f"split{s}")
@pytest.mark.parametrize("op", list(GATES))
def test_split_resume(op, s, first, second):
    T, C = 130, 16
    x = delta_inputs(T, gate=GATES[op], with_state=True)
    o1, S1 = run(op, x.sliced(0, s), C if first == "chunk" else None, state=x.state)
    o2, S2 = run(op, x.sliced(s, T), C if second == "chunk" else None, state=S1)
    assert_same((torch.cat([o1, o2], dim=1), S2), run(op, x, C), f"{op} split at {s}")


@pytest.mark.parametrize("s", [1, 64, 77], ids=lambda s: f"split{s}")
def test_linear_attention_split_resume(s):
    T, C = 130, 16
    q, k, v, state = linear_inputs(T, with_state=True)
    o1, st = linear_attention(q[:, :s], k[:, :s], v[:, :s], initial_state=state, chunk_size=C)
    o2, (S, z) = linear_attention(q[:, s:], k[:, s:], v[:, s:], initial_state=st)
    o_ref, (S_ref, z_ref) = linear_attention(q, k, v, initial_state=state, chunk_size=C)
    assert_close(torch.cat([o1, o2], dim=1), o_ref, what="output")
    assert_close(S, S_ref, what="S")
    assert_close(z, z_ref, what="z")


@pytest.mark.parametrize("C", CHUNKS, ids=lambda c: f"C{c}")
@pytest.mark.parametrize("mixed", [False, True], ids=["g-5", "g-near-5"])
def test_kda_strong_decay(mixed, C):
    """Gates at K3's lower bound: exp(G_i) * exp(-G_j) would overflow within a chunk."""
    T = 512
    x = delta_inputs(T, gate="channel", with_state=True, g=kda_strong_gates(T, mixed=mixed))
    o, S = run("kda", x, C)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert_same((o, S), run("kda", x, None), f"kda strong decay C={C}")


def test_kda_mixed_strong_and_weak_channels():
    """Some channels forget within a step, others hardly at all, in the same head."""
    T = 200
    g = kda_strong_gates(T, mixed=True)
    g[..., ::2] = -1e-3
    x = delta_inputs(T, gate="channel", with_state=True, g=g)
    assert_same(run("kda", x, 64), run("kda", x, None), "kda mixed channels")


def test_bf16_inputs_keep_dtype_and_fp32_state():
    x = delta_inputs(65, gate="channel", with_state=True)
    xb = DeltaInputs(*(t.bfloat16() for t in (x.q, x.k, x.v, x.g, x.beta)), x.state)
    o, S = run("kda", xb, 16)
    o_ref, S_ref = run("kda", xb, None)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert_close(o, o_ref, what="bf16 output")
    assert_close(S, S_ref, what="state from bf16 inputs", dtype=torch.float32)
