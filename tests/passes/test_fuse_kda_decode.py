"""fuse-kda-decode: every KDA layer of a decode step becomes one kda_decode_step, in k3-tiny
(sigmoid gate, full-rank output gate) and kimi-linear-tiny (softplus gate, low-rank output
gate); the interpreter gives the same outputs before and after (the fp32 row); a prefill or
extend keeps its ops; and the pipeline has the pass exactly where the backend lowers the op."""

from __future__ import annotations

import pytest
import torch
from factories import example_ids
from passes_testlib import inputs_for

import k3c
from k3c import ir, passes
from k3c.models.kda_layer import KDAMixer
from k3c.numerics import assert_close

MODELS = ["k3-tiny", "kimi-linear-tiny"]


def with_fusion(graph: ir.Graph, report: list | None = None) -> ir.Graph:
    steps = passes.steps_of("default")
    at = steps.index("fuse-norms") + 1
    return passes.run(graph, steps[:at] + ["fuse-kda-decode"] + steps[at:], report=report)


def _sites(report) -> int:
    return next(e.sites for e in report if e.name == "fuse-kda-decode").get("kda-decode-step", 0)


@pytest.mark.parametrize("name", MODELS)
def test_every_kda_layer_of_a_decode_step_is_one_op(zoo, name):
    model, _, decode = zoo(name)
    n_kda = sum(isinstance(m, KDAMixer) for m in model.modules())
    assert n_kda > 0
    report: list = []
    after = with_fusion(decode, report)
    counts = after.op_counts()
    assert _sites(report) == n_kda
    assert counts["kda_decode_step"] == n_kda
    for op in ("kda", "short_conv", "l2norm", "gated_rms_norm"):
        assert op not in counts, op
    # every recurrent state the graph returns is a fused step's output
    steps = {o for n in after.nodes if n.op == "kda_decode_step" for o in n.outputs}
    recurrent = [v for k, v in after.outputs if k.rsplit(".", 1)[-1] in ("S", "conv_q", "conv_k", "conv_v")]
    assert len(recurrent) == 4 * n_kda and set(recurrent) <= steps

    ids = example_ids(model, 3, 1, seed=5)
    inputs = inputs_for(decode, {"B": 3, "P": 7}, seed=5, input_ids=ids)
    plain = passes.run(decode, "default")
    for (out, _), a, b in zip(decode.outputs, ir.interpret(plain, *inputs), ir.interpret(after, *inputs)):
        assert_close(b, a, torch.float32, what=f"{name} decode {out}")


@pytest.mark.parametrize("entry", ["prefill", "extend"])
def test_prefill_and_extend_keep_their_ops(zoo, entry):
    model, prefill, _ = zoo("k3-tiny")
    graph = prefill if entry == "prefill" else k3c.capture(model, (example_ids(model, 2, 16),), entry="extend")
    report: list = []
    after = with_fusion(graph, report)
    assert _sites(report) == 0 and "kda_decode_step" not in after.op_counts()
    assert str(after) == str(passes.run(graph, "default"))


def test_a_kda_output_read_elsewhere_is_left_alone(zoo):
    """The step's output leaves the layer only through its gated norm: a second reader of o
    (here a graph output) keeps the layer's ops."""
    _, _, decode = zoo("k3-tiny")
    g = passes.run(decode, ["constant-fold", "cse", "fuse-norms"])
    first = next(n for n in g.nodes if n.op == "kda")
    g.outputs.append(("probe", first.outputs[0]))
    after = passes.run(g, ["fuse-kda-decode"])
    assert after.op_counts()["kda"] == 1 and after.op_counts()["kda_decode_step"] == g.op_counts()["kda"] - 1


@pytest.mark.parametrize("backend, fused", [("tvm", True), ("triton", True), ("onnx", False), ("reference", False)])
def test_the_pipeline_fuses_where_the_backend_lowers_the_op(backend, fused):
    be = k3c.backends.get(backend)
    steps = passes.for_backend(passes.steps_of("default"), **passes.backend_choices(be))
    assert ("fuse-kda-decode" in steps) is fused
    if fused:
        assert steps.index("fuse-kda-decode") == steps.index("fuse-norms") + 1
        said = [*passes.steps_of("default"), "fuse-kda-decode"]  # a pipeline that says it already
        assert passes.for_backend(said, **passes.backend_choices(be)).count("fuse-kda-decode") == 1


def test_a_pipeline_can_keep_the_step_unfused(zoo):
    """`fuse-kda-decode{enable=false}` named in a pipeline: the backend does not add the pass
    again, and the decode step keeps its ops (the unfused row of bench_serving's slots)."""
    be = k3c.backends.get("tvm")
    said = [*passes.steps_of("default"), "fuse-kda-decode{enable=false}"]
    steps = passes.for_backend(said, **passes.backend_choices(be))
    assert [s for s in steps if s.startswith("fuse-kda-decode")] == ["fuse-kda-decode{enable=false}"]
    _, _, decode = zoo("k3-tiny")
    assert "kda_decode_step" not in passes.run(decode, steps).op_counts()


@pytest.mark.parametrize("compute", ["f32", "bf16"])
def test_a_release_precision_decode_step_is_fused_after_its_compute_policy(compute):
    """A model held in BF16 reaches fuse-kda-decode in float32 only after compute-dtype, and
    its gated norm is one only once that pass has dropped the model's casts: the backend's
    pipeline fuses there, so every KDA layer of its decode step is one op, and the step
    computes what the unfused step computes under the same policy (the fp32 row)."""
    model = k3c.models.build("k3-tiny", dtype=torch.bfloat16, experts="mxfp4").eval()
    decode = k3c.capture(model, (example_ids(model, 2, 1),), entry="decode")
    be = k3c.backends.get("tvm")
    steps = passes.for_backend(passes.steps_of("default"), **passes.backend_choices(be), compute=compute)
    at = next(i for i, s in enumerate(steps) if s.startswith("compute-dtype"))
    assert steps[at + 1:at + 3] == ["fuse-norms", "fuse-kda-decode"] and steps.count("fuse-kda-decode") == 1
    fused = passes.run(decode, steps)
    n_kda = sum(isinstance(m, KDAMixer) for m in model.modules())
    assert fused.op_counts()["kda_decode_step"] == n_kda and "kda" not in fused.op_counts()
    plain = passes.run(decode, [s for s in steps if s != "fuse-kda-decode"])
    assert "kda_decode_step" not in plain.op_counts()
    inputs = inputs_for(plain, {"B": 2, "P": 5}, seed=3, input_ids=example_ids(model, 2, 1, seed=3))
    for (out, _), a, b in zip(plain.outputs, ir.interpret(plain, *inputs), ir.interpret(fused, *inputs)):
        assert_close(b, a, torch.float32, what=f"release decode ({compute} compute) {out}")
