"""Every compiled runner enforces the bounds the model has, which capture records in the IR's
dims and each artifact's manifest: GPT-2's position table (TVM returned finite logits for a
prefill of 600 tokens and for decode at P = 512 ... 100000), the vocabulary (torch's `index out
of range in self` on reference and triton), and a decode state of the right names."""

from __future__ import annotations

import json

import pytest
import torch

import k3c
from k3c.errors import InputError

BACKENDS = ["reference", "onnx", "tvm", "triton"]


@pytest.fixture(scope="module")
def gpt2():
    return k3c.models.build("gpt2-tiny")  # n_positions = 512, vocab 1024


@pytest.fixture(scope="module")
def compiled(gpt2, tmp_path_factory):
    root = tmp_path_factory.mktemp("runners")
    ids = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))
    return {b: k3c.compile(gpt2, b, (ids,), out_dir=root / b) for b in BACKENDS}


def _full_cache(model, P: int) -> dict[str, torch.Tensor]:
    D = model.config.n_embd // model.config.n_head
    return {f"{kv}": torch.zeros(1, P, model.config.n_head, D) for kv in ("k", "v")}


def _state(compiled_model, model, P: int) -> dict[str, torch.Tensor]:
    one = _full_cache(model, P)
    return {n: one[n.rsplit(".", 1)[-1]] for n in compiled_model.graphs["decode"].inputs[1:]}


def test_capture_records_the_position_bound_in_the_dims(compiled):
    graphs = compiled["reference"].graphs
    assert graphs["prefill"].dims["T"] == (1, 512)
    assert graphs["decode"].dims["P"] == (1, 511)


@pytest.mark.parametrize("backend", ["onnx", "tvm"])
def test_manifests_declare_the_bound(compiled, backend):
    m = json.loads((compiled[backend].out_dir / "manifest.json").read_text())
    dims = m["dims"] if backend == "onnx" else m["entries"]["prefill"]["dims"]
    assert dims["T"] == [1, 512]


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_past_the_position_table_is_refused(compiled, backend):
    with pytest.raises(InputError, match="T = 513"):
        compiled[backend].prefill(torch.zeros(1, 513, dtype=torch.long))


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_at_a_full_position_table_is_refused(compiled, gpt2, backend):
    with pytest.raises(InputError, match="P = 512"):
        compiled[backend].decode(torch.zeros(1, 1, dtype=torch.long), _state(compiled[backend], gpt2, 512))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_outside_the_vocabulary_are_refused(compiled, backend):
    ids = torch.zeros(1, 4, dtype=torch.long)
    ids[0, 3] = 1024
    with pytest.raises(InputError, match="1024"):
        compiled[backend].prefill(ids)


@pytest.mark.parametrize("backend", ["reference", "onnx"])
def test_decode_names_a_missing_or_foreign_state_entry(compiled, gpt2, backend):
    run = compiled[backend]
    state = _state(run, gpt2, 3)
    with pytest.raises(InputError, match="lacks"):
        run.decode(torch.zeros(1, 1, dtype=torch.long), {k: v for k, v in state.items() if k != "layers.1.v"})
    with pytest.raises(InputError, match="another model"):
        run.decode(torch.zeros(1, 1, dtype=torch.long), {**state, "layers.0.S": torch.zeros(1, 4, 32, 32)})
