"""k3-tiny compiled for TVM and for Triton decodes with KDA's fused decode step: the decode
graph holds one kda_decode_step per KDA layer and none of the ops it was fused from, the
artifact calls the backend's own kernel (the TVM library's symbol, the Triton module's call),
and prefill then several decode steps equal eager, logits and every recurrent state, at the
float32 row of k3c/numerics.py. Whole-model builds (TVM) and the interpreter (Triton) take
half a minute each here: the slow tier."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.models.kda_layer import KDAMixer
from k3c.numerics import assert_close

STEPS = 4


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tvm", "triton"])
def test_k3_tiny_decodes_with_the_fused_step(backend, tmp_path):
    model = k3c.models.build("k3-tiny").eval()
    n_kda = sum(isinstance(m, KDAMixer) for m in model.modules())
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (3, 9 + STEPS), generator=gen)
    compiled = k3c.compile(model, backend, (ids[:, :9],), out_dir=tmp_path / backend)

    counts = compiled.graphs["decode"].op_counts()
    assert counts.get("kda_decode_step") == n_kda, counts
    assert not {"kda", "short_conv", "l2norm", "gated_rms_norm"} & set(counts)
    assert "kda_decode_step" not in compiled.graphs["prefill"].op_counts()
    if backend == "tvm":
        assert b"kda_decode_step" in (compiled.out_dir / "lib.so").read_bytes()
    else:
        source = "\n".join(p.read_text() for p in compiled.out_dir.glob("*.py"))
        assert source.count("= kda_decode_step(") == n_kda

    with torch.no_grad():
        logits_ref, state_ref = model.prefill(ids[:, :9])
        logits, state = compiled.prefill(ids[:, :9])
        assert_close(logits, logits_ref, torch.float32, what="prefill logits")
        for t in range(9, 9 + STEPS):
            logits_ref, state_ref = model.decode(ids[:, t:t + 1], state_ref)
            logits, state = compiled.decode(ids[:, t:t + 1], state)
            assert_close(logits, logits_ref, torch.float32, what=f"decode {t} logits")
            recurrent = [k for k in state_ref if k.rsplit(".", 1)[-1] in ("S", "conv_q", "conv_k", "conv_v")]
            assert len(recurrent) == 4 * n_kda
            for k in recurrent:
                assert_close(state[k], state_ref[k], torch.float32, what=f"decode {t} {k}")
