"""k3-tiny as K3 is released (BF16 weights, the release's F32 tensors, MXFP4 routed experts) on
every backend, computing in float32 from the stored weights, against the eager model in float32
on the same weights (BF16 widened, MXFP4 decoded exactly) at the tolerance `k3c diff` derives
(at least the fp32 row of k3c/numerics.py). Decode steps feed each backend its own state.

A BF16 *computation* of this MoE model is no test of a backend (a routing flip moves a
token's logits by O(1)); tests/models/test_bf16_eager.py checks BF16 compute block by block.
"""

from __future__ import annotations

import pytest
import torch

from k3c import models
from k3c.compiler import prepare
from k3c.diff import backend_for, diff

BACKENDS = ["reference", "onnx", "onnx:ort", "tvm", "triton"]


@pytest.fixture(scope="module")
def model():
    # four layers: KDA, MoE with MXFP4 experts, one MLA layer (the fourth) and an AttnRes block
    return models.build("k3-tiny", seed=3, dtype=torch.bfloat16, experts="mxfp4", num_layers=4, mla_layers=(4,))


@pytest.fixture(scope="module")
def report(model):
    return diff(model, BACKENDS, seq_len=24, decode_steps=3, timing=False, bisect=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_mxfp4_model_computes_in_fp32_on_every_backend(report, backend):
    assert report.compute == "f32"
    b = report.backends[backend]
    assert b.error is None and b.ok, report.table(per_tensor=True)
    assert {t.name.split("/")[0] for t in b.tensors} >= {"prefill", "decode0", "decode2", "final"}


def test_the_stored_precision_is_what_the_artifacts_hold(model, tmp_path):
    """The experts stay codes through every backend's graph: TVM's and Triton's kernels read
    them (the decode folded into the expert GEMMs), portable ONNX decodes them in the graph and
    the ort flavour re-encodes them for MatMulNBits (tests/onnx/test_ort_mxfp4.py); no backend
    holds a float copy of the experts among its weights. Dense weights stay BF16."""
    from k3c.compiler import capture_entries

    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    captured = capture_entries(model, (ids,))
    for spec in ("onnx", "onnx:ort", "tvm", "triton"):
        g = prepare({"prefill": captured["prefill"]}, backend_for(spec, "f32"))["prefill"]
        dtypes = {t.dtype for w, t in g.types.items() if w in g.weights}
        assert "u8" in dtypes and "bf16" in dtypes, (spec, dtypes)
        assert not any(("w13" in w or "w2" in w) and g.types[w].dtype in ("f32", "bf16") and
                       "experts" in w for w in g.weights), spec
        ops = {n.op for n in g.nodes}
        if spec in ("tvm", "triton"):
            assert "moe_experts_mxfp4" in ops and "mxfp4_decode" not in ops, ops
        elif spec == "onnx:ort":
            assert "moe_experts_mxfp4" in ops and "mxfp4_decode" not in ops, ops  # MatMulNBits
        else:
            assert "mxfp4_decode" in ops, ops
