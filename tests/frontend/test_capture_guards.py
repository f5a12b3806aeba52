"""What capture used to drop: a KDA layer called twice (tied weights) crashed the reference and
Triton backends with a bare "RuntimeError:"; dynamic=False gave a decode entry for the 3-token
example cache alone; a slice along the sequence axis (a token shift) failed in torch.export and
k3c printed only the first line of the reason."""

from __future__ import annotations

import pytest
import torch
from custom_models import PairSums, TiedKDA, TokenShift, build

import k3c
from k3c.diff import diff
from k3c.errors import CaptureError, InputError


def _ids(T: int, vocab: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_layer_called_twice_compiles_and_matches_eager(backend):
    report = diff(build(TiedKDA), [backend], seq_len=20, decode_steps=2)
    b = report.backends[backend]
    assert b.error is None and b.ok, report.table(per_tensor=True)


@pytest.mark.parametrize("backend", ["reference", "onnx"])
def test_dynamic_false_keeps_a_decode_that_grows(backend, tmp_path):
    model = k3c.models.build("gpt2-tiny")
    ids = _ids(12, 1024)
    run = k3c.compile(model, backend, (ids[:, :8],), out_dir=tmp_path / backend, dynamic=False)
    logits, state = run.prefill(ids[:, :8])
    ref_logits, ref_state = model.prefill(ids[:, :8])
    for t in range(8, 12):  # the cache grows past the example's length, one token a step
        logits, state = run.decode(ids[:, t:t + 1], state)
        ref_logits, ref_state = model.decode(ids[:, t:t + 1], ref_state)
        k3c.numerics.assert_close(logits, ref_logits, what=f"decode at P={t}")
    with pytest.raises(InputError, match="dim 1 is 9, expected 8"):  # the prefill is static, and says so
        run.prefill(ids[:, :9])


def test_a_token_shift_is_captured_with_the_lengths_it_needs():
    model = build(TokenShift)
    graph = k3c.capture(model, (_ids(16),))
    assert graph.dims["T"] == (3, None)  # (T - 1) must not be 1: torch.export specialises it
    ref = k3c.backends.get("reference").runner({"prefill": graph})
    k3c.numerics.assert_close(ref.run("prefill", _ids(7))[0], model.prefill(_ids(7))[0])
    with pytest.raises(InputError, match="dim T = 2 is outside its range"):
        ref.run("prefill", _ids(2))


def test_a_capture_that_cannot_work_carries_torchs_whole_reason():
    with pytest.raises(CaptureError) as e:
        k3c.capture(build(PairSums), (_ids(16),))
    text = str(e.value)
    assert text.count("Not all values of T") >= 3  # every violated guard, not the first line
    assert "generated guard" in text and "draft_export" not in text


def test_dynamic_false_on_tvm_moe_is_a_clear_refusal():
    from k3c.compiler import capture_entries
    from k3c.errors import UnsupportedNodeError

    model = k3c.models.build("k3-tiny", num_layers=2, mla_layers=(2,), first_k_dense=0)
    graphs = capture_entries(model, (_ids(8, 1024),), dynamic=False)
    with pytest.raises(UnsupportedNodeError, match="moe_experts .*needs a dynamic token count"):
        k3c.backends.check_supported(k3c.backends.get("tvm"), k3c.passes.run(graphs["prefill"], "default"))
