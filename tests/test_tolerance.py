"""A tolerance that a correct lowering exceeds is as wrong as one a wrong lowering passes:
`k3c diff --model k3-tiny --backends onnx,tvm --seq-len 16 --decode-steps 1` failed both at a
relative RMS of 1.01e-5 against a fixed 1e-5, on valid input, every time. The eager fp32 model
is itself that far from its float64 copy, so the tolerance now follows that measured noise
(k3c.numerics.model_tolerance) and the case passes; a wrong kernel is still caught (test_diff)."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.diff import diff
from k3c.numerics import MODEL_SAFETY_RMS, TOLERANCES


@pytest.fixture(scope="module")
def report():
    return diff(k3c.models.build("k3-tiny"), ["onnx", "tvm"], seq_len=16, decode_steps=1, timing=False)


def test_the_false_alarm_case_passes(report):
    for b in report.backends.values():
        assert b.error is None and b.ok, report.table(per_tensor=True)


def test_eager_is_as_noisy_as_the_old_fixed_tolerance(report):
    noise = {t.name: t.noise_rel_rms for t in report.backends["onnx"].tensors}
    # the measured yardstick: eager's decode logits are several 1e-6 from float64, so a backend
    # that is as accurate as eager differs from it by about sqrt(2) times that, past 1e-5
    assert noise["decode0/logits"] > 2e-6
    for b in report.backends.values():
        for t in b.tensors:
            # never below the dtype's row, and MODEL_SAFETY_RMS times eager's noise where that is more
            assert t.tol_rel_rms >= TOLERANCES[torch.float32].rel_rms
            assert t.tol_rel_rms >= MODEL_SAFETY_RMS * t.noise_rel_rms * (1 - 1e-9)
