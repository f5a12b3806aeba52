"""The k3c exporter backend's contract in-process, on a k3c model (taken as it is): the runner
against the eager model, and the one-line errors of its config and its inputs."""

from __future__ import annotations

import pytest
import torch

import k3c
from k3c.errors import InputError, UsageError
from k3c.numerics import assert_close

pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers==5.24.0)")
from transformers.exporters import AutoExportConfig, AutoHfExporter  # noqa: E402

from k3c.integrations.transformers import K3cExportConfig  # noqa: E402


@pytest.fixture(scope="module")
def exported():
    model = k3c.models.build("gpt2-tiny", seed=3).eval()
    config = K3cExportConfig(backend="reference")
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    return model, AutoHfExporter.from_config(config).export_for_generation(model, {"input_ids": ids}, config)


def test_runner_prefill_decode_extend_match_the_eager_model(exported):
    model, out = exported
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, state = model.prefill(ids[:, :9])
        got = out.runners["prefill"](input_ids=ids[:, :9], attention_mask=torch.ones(2, 9, dtype=torch.long))
        assert_close(got.logits, want, what="prefill")
        step = out.runners["decode"](input_ids=ids[:, 9:10], cache=got.cache)
        want, state = model.decode(ids[:, 9:10], state)
        assert_close(step.logits, want, what="decode")
        more = out.runners["decode"](input_ids=ids[:, 10:12], cache=step.cache)
        want, _ = model.extend(ids[:, 10:12], state)
        assert_close(more.logits, want, what="extend")


def test_runner_refuses_padding_and_kwargs_it_does_not_take(exported):
    model, out = exported
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(InputError, match="attention_mask with padding"):
        out.runners["prefill"](input_ids=ids, attention_mask=mask)
    with pytest.raises(UsageError, match="inputs_embeds"):
        out.runners["prefill"](input_ids=ids, inputs_embeds=torch.zeros(2, 4, 8))
    with pytest.raises(InputError, match="input_ids"):
        out.runners["prefill"](attention_mask=mask)


def test_config_names_what_does_not_fit():
    with pytest.raises(UsageError, match="backend='tensorrt'"):
        K3cExportConfig(backend="tensorrt")
    with pytest.raises(UsageError, match="flavour='ort' is an onnx option"):
        K3cExportConfig(backend="tvm", flavour="ort")
    back = AutoExportConfig.from_dict(K3cExportConfig(backend="tvm", target="llvm").to_dict())
    assert isinstance(back, K3cExportConfig) and back.target == "llvm"
