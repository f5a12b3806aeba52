"""The float64 yardstick of k3c diff (k3c/yardstick.py) is float64 throughout: every parameter
and buffer of the copy, and the output of every operation it runs, prefill (past a chunk, so
the chunked delta rules run) and a decode step, inside the k3c torch ops too. The models cast
to float32 on purpose in many places (norms, the router, gates, attention scores, new states),
which `model.double()` alone keeps: the detector is shown to find those, so it can fail."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import k3c
from k3c.models.precision import fp32_copy
from k3c.yardstick import float64_copy, float64_mode


class NarrowOps(TorchDispatchMode):
    """Records every operation whose floating output is not float64."""

    def __init__(self):
        super().__init__()
        self.found: dict[str, torch.dtype] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype != torch.float64:
                self.found.setdefault(str(func), o.dtype)
        return out


def _run(model, mode: bool) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (2, 70), generator=torch.Generator().manual_seed(0))
    rec = NarrowOps()
    with torch.no_grad(), (float64_mode() if mode else torch.no_grad()), rec:
        logits, state = model.prefill(ids)
        logits, state = model.decode(ids[:, :1], state)
    assert logits.dtype == torch.float64 and all(v.dtype == torch.float64 for v in state.values()
                                                  if v.is_floating_point())
    return rec.found


MODELS = {
    "k3-tiny": lambda: k3c.models.build("k3-tiny"),  # KDA (sigmoid gate), MLA, latent MoE and its router
    "kimi-linear-tiny": lambda: k3c.models.build("kimi-linear-tiny"),  # KDA with the softplus gate
    "gated-deltanet-tiny": lambda: k3c.models.build("gated-deltanet-tiny"),
    "gpt2-tiny": lambda: k3c.models.build("gpt2-tiny"),
    "k3-tiny bf16 mxfp4": lambda: fp32_copy(k3c.models.build("k3-tiny", dtype="bfloat16", experts="mxfp4")),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_yardstick_is_float64_throughout(name):
    exact = float64_copy(MODELS[name]())
    narrow = {k: t.dtype for k, t in [*exact.named_parameters(), *exact.named_buffers()]
              if t.is_floating_point() and t.dtype != torch.float64}
    assert not narrow, f"float64 copy holds narrower tensors: {narrow}"
    found = _run(exact, mode=True)
    assert not found, f"operations that left float64: {found}"


def test_the_detector_finds_the_float32_casts_of_a_plain_double_copy():
    found = _run(k3c.models.build("k3-tiny").double(), mode=False)
    assert "aten._to_copy.default" in found and len(found) > 5, found
