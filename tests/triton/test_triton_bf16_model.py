"""A BF16 model through the Triton backend computing BF16 (fp32 accumulation and state), whole,
against the same weights in fp32 eager, at the derived BF16 row (k3c.numerics.bf16_vs_fp32).

Whole-model logits are a test only where routing cannot flip: a dense model
(gated-deltanet-tiny: short convs, the gated delta rule, gated norms, SwiGLU MLPs). MoE models
are checked op by op (test_triton_bf16.py) and block by block in eager
(tests/models/test_bf16_eager.py)."""

from __future__ import annotations

import pytest
import torch
from factories import example_ids

import k3c
from k3c.numerics import bf16_vs_fp32, rel_rms_err, scaled_max_abs_err

NAME = "gated-deltanet-tiny"


@pytest.fixture(scope="module")
def models_and_artifact(tmp_path_factory):
    bf16 = k3c.models.build(NAME, seed=1, dtype=torch.bfloat16).eval()
    fp32 = k3c.models.build(NAME, seed=1).eval()
    fp32.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in bf16.state_dict().items()})
    ids = example_ids(fp32, 1, 12, seed=3)
    compiled = k3c.compile(bf16, "triton", (ids[:, :8],), out_dir=tmp_path_factory.mktemp("bf16-triton"))
    return bf16, fp32, compiled, ids


def within(actual: torch.Tensor, expected: torch.Tensor, blocks: int, what: str) -> None:
    tol = bf16_vs_fp32(blocks)
    rr, mae = rel_rms_err(actual.float(), expected), scaled_max_abs_err(actual.float(), expected)
    assert torch.isfinite(actual).all() and rr <= tol.rel_rms and mae <= tol.max_abs, \
        f"{what}: rel_rms {rr:.2e} (<= {tol.rel_rms:.2e}), scaled max_abs {mae:.2e} (<= {tol.max_abs:.2e})"


def test_a_dense_bf16_model_on_triton_matches_fp32(models_and_artifact):
    bf16, fp32, compiled, ids = models_and_artifact
    blocks = 2 * fp32.config.num_layers  # a token mixer and an MLP per layer, in sequence
    with torch.no_grad():
        got, state = compiled.prefill(ids[:, :10])
        want, want_state = fp32.prefill(ids[:, :10])
        assert got.dtype == torch.bfloat16, f"the artifact computed in {got.dtype}, not in the model's bf16"
        within(got.cpu(), want, blocks, "prefill logits")
        for t in (10, 11):  # decode fed the artifact's own state
            got, state = compiled.decode(ids[:, t:t + 1], state)
            want, want_state = fp32.decode(ids[:, t:t + 1], want_state)
        within(got.cpu(), want, blocks, "decode logits")
    recurrent = [k for k in want_state if k.endswith(".S")]
    assert recurrent and all(state[k].dtype == torch.float32 for k in recurrent)  # the state stays fp32
    for k in recurrent:
        within(state[k].cpu(), want_state[k], blocks, f"state {k}")
