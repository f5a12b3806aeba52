"""Every tiny zoo model through both ONNX flavours against the eager model: prefill at
T = 1, 63, 130 (captured at T = 16, B = 2), a 16-step decode loop fed with the state the
artifact returned, and onnx.checker with full checks on every file."""

from __future__ import annotations

import onnx
import pytest
from factories import DECODE_STEPS, PREFILL_T, TINY
from factories import ONNX_DECODE_PROMPT as DECODE_PROMPT

from k3c.numerics import assert_close

FLAVOURS = ["portable", "ort"]


def state_names(runner, entry: str = "prefill") -> list[str]:
    return [o["state"] for o in runner.manifest["entries"][entry]["outputs"][1:]]


def check_prefill(runner, model, ref, T: int, label: str) -> None:
    outs = runner.run("prefill", ref["ids"][:, :T])
    logits, state = ref["prefill"][T]
    assert_close(outs[0], logits, what=f"{label} logits at T={T}")
    names = state_names(runner)
    assert sorted(names) == sorted(state)
    for n, o in zip(names, outs[1:]):
        assert_close(o, state[n], what=f"{label} state {n} at T={T}")


def check_decode_loop(runner, ref, label: str) -> None:
    ids = ref["ids"]
    outs = runner.run("prefill", ids[:, :DECODE_PROMPT])
    state = dict(zip(state_names(runner), outs[1:]))
    decode_inputs = [i["state"] for i in runner.manifest["entries"]["decode"]["inputs"][1:]]
    for step, t in enumerate(range(DECODE_PROMPT, DECODE_PROMPT + DECODE_STEPS)):
        outs = runner.run("decode", ids[:, t:t + 1], *[state[n] for n in decode_inputs])
        assert_close(outs[0], ref["decode"][step], what=f"{label} decode step {step} logits")
        state = dict(zip(state_names(runner, "decode"), outs[1:]))
    for n, v in state.items():
        assert_close(v, ref["final_state"][n], what=f"{label} state {n} after {DECODE_STEPS} decode steps")


@pytest.mark.parametrize("T", PREFILL_T, ids=lambda t: f"T{t}")
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", TINY)
def test_prefill_matches_eager(name, flavour, T, zoo_artifact, eager_results):
    model, _, _, runner = zoo_artifact(name, flavour)
    check_prefill(runner, model, eager_results(model), T, f"{name}/{flavour}")


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", TINY)
def test_decode_loop_matches_eager(name, flavour, zoo_artifact, eager_results):
    model, _, _, runner = zoo_artifact(name, flavour)
    check_decode_loop(runner, eager_results(model), f"{name}/{flavour}")


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("name", TINY)
def test_checker_full(name, flavour, zoo_artifact):
    _, graphs, out, _ = zoo_artifact(name, flavour)
    for entry in graphs:
        onnx.checker.check_model(str(out / f"{entry}.onnx"), full_check=True)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_k3_tiny_without_passes(flavour, zoo_artifact, eager_results):
    """The captured graph as it is: recurrent kda in prefill (lowered chunked), unfused
    experts (moe_gate_up / moe_down), expanded MLA in decode."""
    model, graphs, out, runner = zoo_artifact("k3-tiny", flavour, "none")
    assert {"kda", "moe_gate_up", "mla_attention"} <= set(graphs["prefill"].op_counts())
    ref = eager_results(model)
    check_prefill(runner, model, ref, 130, f"k3-tiny/{flavour}/none")
    check_decode_loop(runner, ref, f"k3-tiny/{flavour}/none")
    onnx.checker.check_model(str(out / "prefill.onnx"), full_check=True)


def test_ort_flavour_maps_k3_tiny(zoo_artifact):
    """What the ort flavour made of k3-tiny (the default pipeline as it runs it: KDA left
    whole for onnxruntime's kernel): the prefill and decode recurrences are LinearAttention,
    the prefill convs a depthwise Conv and decode's CausalConvWithState, SiTU experts one Gemm per
    expert in prefill, ..."""
    _, _, _, runner = zoo_artifact("k3-tiny", "ort")
    pre, dec = runner.manifest["lowering"]["prefill"], runner.manifest["lowering"]["decode"]
    assert pre["kda -> com.microsoft::LinearAttention"] == 6
    assert pre["short_conv -> ai.onnx::Conv"] == 18
    assert dec["short_conv -> com.microsoft::CausalConvWithState"] == 18
    assert pre["rms_norm -> ai.onnx::RMSNormalization"] > 0
    assert pre["mla_attention -> ai.onnx::Attention"] == 3
    assert dec["kda -> com.microsoft::LinearAttention"] == 6
    assert dec["mla_attention_absorbed -> ai.onnx::Attention"] == 3
    assert pre["moe_experts -> ai.onnx::Gemm"] == 8 * 2 * 8  # SiTU: two Gemms per expert
    assert dec["moe_experts -> k3c::moe_experts_situ"] == 8  # a decode step keeps the gathered body


def test_ort_flavour_runs_kimi_linear_experts_on_ort_moe(zoo_artifact):
    """Kimi Linear's SiLU-GLU experts fit onnxruntime's MoE (K3's SiTU ones do not)."""
    _, _, _, runner = zoo_artifact("kimi-linear-tiny", "ort")
    for entry in ("prefill", "decode"):
        assert runner.manifest["lowering"][entry]["moe_experts -> com.microsoft::MoE"] == 5


def test_decode_state_names_round_trip(zoo_artifact):
    """Prefill outputs feed decode inputs by name; decode outputs are present.<name>."""
    _, graphs, _, runner = zoo_artifact("k3-tiny", "portable")
    m = runner.manifest
    pre_out = [o["name"] for o in m["entries"]["prefill"]["outputs"]]
    dec_in = [i["name"] for i in m["entries"]["decode"]["inputs"]]
    dec_out = [o["name"] for o in m["entries"]["decode"]["outputs"]]
    assert pre_out[0] == dec_out[0] == "logits" and dec_in[0] == "input_ids"
    assert pre_out[1:] == dec_in[1:] == m["state"]
    assert dec_out[1:] == [f"present.{n}" for n in m["state"]]
    assert {"layers.0.S", "layers.0.conv_q", "layers.3.ckv", "layers.3.krope"} <= set(m["state"])
    ckv = next(i for i in m["entries"]["decode"]["inputs"] if i["name"] == "layers.3.ckv")
    assert ckv["shape"] == ["B", "P", 32] and ckv["dtype"] == "float32"
    new_ckv = next(o for o in m["entries"]["decode"]["outputs"] if o["name"] == "present.layers.3.ckv")
    assert new_ckv["shape"] == ["B", "P + 1", 32]
