"""The k3c-domain function bodies, one op at a time, against the interpreter (the naive
references) and, for the portable flavour, through onnx's own reference evaluator.

Shapes are awkward on purpose: head dims 12 and 10, T of 1, 63, 65 and 130 with chunk size
16 (up to nine chunks), B = 2.
"""

from __future__ import annotations

import pytest
import torch
from onnx_cases import (
    E,
    attention_case,
    attn_res_case,
    chunk_output_case,
    chunk_prepare_case,
    chunk_scan_case,
    gated_mlp_case,
    moe_case,
    recurrent_case,
    run_ort,
    run_reference_evaluator,
    short_conv_case,
    situ_case,
)

from k3c.ir import interpret
from k3c.numerics import assert_close

RECURRENT = ["kda", "gated_delta_rule", "delta_rule", "linear_attention"]
FLAVOURS = ["portable", "ort"]


def check(case, flavour="portable", evaluator=False, **options):
    want = interpret(case.graph, *case.inputs)
    got = run_ort(case.graph, case.inputs, flavour, **options)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a, b, what=f"{case.graph.name} output {i} ({flavour})")
    if evaluator:
        for i, (a, b) in enumerate(zip(run_reference_evaluator(case.graph, case.inputs, **options), want)):
            assert_close(a, b, what=f"{case.graph.name} output {i} (onnx reference evaluator)")


@pytest.mark.parametrize("T", [1, 63, 65, 130], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("op", RECURRENT)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recurrent_chunked(op, T, flavour):
    """Prefill (symbolic T) as compiled: chunk-delta-rule's pieces, or the whole op through
    LinearAttention in the ort flavour (which the pass leaves whole for it)."""
    check(recurrent_case(op, T=T), flavour, chunk_size=16)


@pytest.mark.parametrize("chunk_size", [20, 48, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("op", ["kda", "gated_delta_rule"])
def test_chunk_sizes(op, chunk_size):
    """The WY inverse pads C up to a power of two (20 -> 32, 48 -> 64; 64 as it is) and the
    in-block decay pairs go in blocks of 8 rows when 8 divides C (48, 64), else in one block
    (20); all against the recurrence, T = 130 and 70."""
    check(recurrent_case(op, T=130), chunk_size=chunk_size)
    check(recurrent_case(op, T=70), evaluator=True, chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [16, 32], ids=lambda c: f"C{c}")
def test_factored_decays_near_their_limit(chunk_size):
    """KDA's scores go as exp(G_i) exp(-G_j) while no chunk decays by more than FACTOR_SPAN
    (64) in a channel: here every chunk decays by 56 to 60 (log-decays of about 3.6 per token
    at C = 16, 1.8 at C = 32), factors out to e^-60 and e^60, against the recurrence."""
    from k3c.backends.onnx.functions.chunked import FACTOR_SPAN

    case = recurrent_case("kda", T=130)
    q, k, v, g, beta, S = case.inputs
    per_token = 57.0 / chunk_size
    g = -(per_token + 0.2 * torch.rand(g.shape, generator=torch.Generator().manual_seed(1)) / chunk_size)
    spans = -torch.nn.functional.pad(g, (0, 0, 0, 0, 0, -130 % chunk_size)).unflatten(1, (-1, chunk_size)).sum(2)
    assert 56.0 < spans.max() < FACTOR_SPAN  # the factored branch, near its limit
    case.inputs[3] = g
    check(case, evaluator=True, chunk_size=chunk_size)


@pytest.mark.parametrize("op", ["kda", "gated_delta_rule"])
def test_strong_decay_stays_finite(op):
    """log-decays down to -40 per token: cumulative gates reach -2500 within a chunk, where
    exp(G_i) * exp(-G_j) would overflow; KDA takes the pairwise branch here, whose every
    factor has an exponent <= 0."""
    check(recurrent_case(op, T=130, g_scale=40.0), chunk_size=64)


@pytest.mark.parametrize("op", RECURRENT)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recurrent_scan(op, flavour):
    """The recurrence itself (a Scan over T), as a prefill the pass did not chunk runs it."""
    check(recurrent_case(op, T=37), flavour, chunk_size=None)


@pytest.mark.parametrize("op", RECURRENT)
def test_recurrent_reference_evaluator(op):
    check(recurrent_case(op, T=40), evaluator=True, chunk_size=16)
    check(recurrent_case(op, T=1, static_T=True), evaluator=True)


@pytest.mark.parametrize("op", RECURRENT)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recurrent_decode_step(op, flavour):
    """T = 1 static (the decode graph): the recurrent body, one step."""
    check(recurrent_case(op, T=1, static_T=True), flavour)


@pytest.mark.parametrize("op", RECURRENT)
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_recurrent_split_resume(op, flavour):
    """Run [0:s], carry the state, run [s:T]: equals one call over [0:T]."""
    T, s = 70, 29
    full = recurrent_case(op, T=T)
    n_state = 2 if op == "linear_attention" else 1
    whole = run_ort(full.graph, full.inputs, flavour, chunk_size=16)
    seq = len(full.inputs) - n_state
    first = run_ort(full.graph, [x[:, :s] for x in full.inputs[:seq]] + full.inputs[seq:], flavour, chunk_size=16)
    second = run_ort(full.graph, [x[:, s:] for x in full.inputs[:seq]] + first[1:], flavour, chunk_size=16)
    assert_close(torch.cat([first[0], second[0]], 1), whole[0], what="resumed output")
    for a, b in zip(second[1:], whole[1:]):
        assert_close(a, b, what="resumed final state")


@pytest.mark.parametrize("T,decode", [(1, True), (1, False), (9, False)], ids=["decode", "prefill-T1", "prefill-T9"])
@pytest.mark.parametrize("activation", ["silu", "none"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_short_conv(activation, T, decode, flavour):
    check(short_conv_case(activation, T=T, decode=decode), flavour, evaluator=flavour == "portable")


def test_short_conv_split_resume():
    case = short_conv_case("silu", T=11)
    x, state = case.inputs
    whole = run_ort(case.graph, case.inputs)
    a = run_ort(case.graph, [x[:, :4], state])
    b = run_ort(case.graph, [x[:, 4:], a[1]])
    assert_close(torch.cat([a[0], b[0]], 1), whole[0], what="resumed conv output")
    assert_close(b[1], whole[1], what="resumed conv state")


@pytest.mark.parametrize("gate", ["channel", "head", "none", "linear"])
def test_chunk_prepare(gate):
    check(chunk_prepare_case(gate), evaluator=True)


@pytest.mark.parametrize("chunk_size", [20, 32, 64], ids=lambda c: f"C{c}")
def test_chunk_prepare_repeated_keys(chunk_size):
    """The hardest case for the WY inverse: every key of a head the same (I + L has its
    largest inverse entries, beta 0.99 and no decay between neighbours), against the
    interpreter's forward substitution; C = 20 and 32 pad the blocks to a power of two."""
    case = chunk_prepare_case("channel", T=70, chunk_size=chunk_size)
    q, k, v, beta, g = case.inputs
    case.inputs[1] = k[:, :1].expand_as(k).contiguous()
    case.inputs[3] = torch.full_like(beta, 0.99)
    case.inputs[4] = g * 1e-3
    check(case, evaluator=True)


@pytest.mark.parametrize("per_channel", [True, False], ids=["decay-per-channel", "decay-per-head"])
def test_chunk_state_scan(per_channel):
    check(chunk_scan_case(per_channel=per_channel), evaluator=True)


@pytest.mark.parametrize("T", [40, 48], ids=["T40-padded", "T48-exact"])
def test_chunk_output(T):
    check(chunk_output_case(T=T), evaluator=True)


@pytest.mark.parametrize("linear_beta", [25.0, None], ids=["capped-up", "identity-up"])
def test_situ(linear_beta):
    check(situ_case(linear_beta), evaluator=True)


@pytest.mark.parametrize("act,linear_beta", [("situ", 25.0), ("situ", None), ("silu", None)],
                         ids=["situ", "situ-identity-up", "silu"])
def test_gated_mlp(act, linear_beta):
    check(gated_mlp_case(act, linear_beta), evaluator=True)


MOE_FORMS = [(2, False), (4, False), (11, False), (11, True)]
MOE_IDS = ["gather-form", "batched-some-experts-idle", "batched", "expert-loop-skewed"]


@pytest.mark.parametrize("N,skewed", MOE_FORMS, ids=MOE_IDS)
@pytest.mark.parametrize("op", ["moe_gate_up", "moe_down"])
def test_moe_pieces(op, N, skewed):
    check(moe_case(op, N, skewed=skewed), evaluator=True)


@pytest.mark.parametrize("N,skewed", MOE_FORMS, ids=MOE_IDS)
@pytest.mark.parametrize("act", ["situ", "silu"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_moe_experts(act, N, skewed, flavour):
    check(moe_case("moe_experts", N, act, skewed=skewed), flavour, evaluator=flavour == "portable")


def test_ort_moe_negative_weights_take_the_body():
    """ORT's MoE takes log(w) as router logits; w < 0 must not go there (an If keeps it exact)."""
    check(moe_case("moe_experts", 11, "silu", negative_weights=True), "ort")


@pytest.mark.parametrize("shape", ["prefill", "decode", "cached-chunk"])
@pytest.mark.parametrize("op", ["causal_attention", "mla_attention", "mla_attention_absorbed"])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_attention(op, shape, flavour):
    T, S = {"prefill": (9, None), "decode": (1, 6), "cached-chunk": (4, 9)}[shape]
    check(attention_case(op, T, S), flavour, evaluator=flavour == "portable")


def test_attn_res_mix():
    check(attn_res_case(), evaluator=True)


ORT_KERNELS = [
    (lambda: recurrent_case("kda"), "kda", "com.microsoft::LinearAttention"),
    (lambda: recurrent_case("linear_attention"), "linear_attention", "com.microsoft::LinearAttention"),
    (lambda: short_conv_case("silu", T=1, decode=True), "short_conv", "com.microsoft::CausalConvWithState"),
    (lambda: short_conv_case("silu"), "short_conv", "ai.onnx::Conv"),
    (lambda: attention_case("causal_attention", 9), "causal_attention", "ai.onnx::Attention"),
    (lambda: attention_case("mla_attention_absorbed", 1, 6), "mla_attention_absorbed", "ai.onnx::Attention"),
    (lambda: moe_case("moe_experts", 11, "silu"), "moe_experts", "com.microsoft::MoE"),
    (lambda: moe_case("moe_experts", 11, "situ"), "moe_experts", "ai.onnx::Gemm"),
]


@pytest.mark.parametrize("make,op,kernel", ORT_KERNELS, ids=[f"{k[1]}-{k[2].split(':')[-1]}" for k in ORT_KERNELS])
def test_ort_flavour_uses_the_kernel(make, op, kernel):
    """The ort flavour really maps these ops (the portable one keeps k3c-domain bodies)."""
    from k3c.backends.onnx import lower_graph

    case = make()
    _, report = lower_graph(case.graph, "ort")
    assert (op, kernel) in report, dict(report)
    _, report = lower_graph(case.graph, "portable")
    assert all(target.startswith("k3c::") for _, target in report), dict(report)


def test_ort_flavour_situ_experts_take_one_gemm_per_expert():
    """SiTU experts (no onnxruntime kernel): two Gemms per expert over the sorted slots, with no
    k3c-domain body left."""
    from k3c.backends.onnx import lower_graph

    _, report = lower_graph(moe_case("moe_experts", 11, "situ").graph, "ort")
    assert dict(report) == {("moe_experts", "ai.onnx::Gemm"): 2 * E}, dict(report)


def test_ort_flavour_keeps_the_body_for_many_experts(monkeypatch):
    """Past MAX_UNROLLED_EXPERTS the per-expert form would bloat the graph: the body (and its
    Loop) stays, and still matches the reference."""
    from k3c.backends.onnx import lower_graph, ort

    monkeypatch.setattr(ort, "MAX_UNROLLED_EXPERTS", E - 1)
    case = moe_case("moe_experts", 11, "situ", skewed=True)
    _, report = lower_graph(case.graph, "ort")
    assert dict(report) == {("moe_experts", "k3c::moe_experts_situ"): 1}, dict(report)
    check(case, "ort")
