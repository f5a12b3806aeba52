"""Errors a user can cause, each a short message that names what is wrong: an op the ONNX
backend cannot lower, a state of the wrong shape or dtype, a bad flavour or option."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx_cases import B_, T_, H, K, V, op_graph
from onnx_cases import f32 as f32_type

from k3c import backends
from k3c.backends import UnsupportedNodeError
from k3c.backends import tables as L
from k3c.backends.onnx import OnnxBackend, OnnxRunner, lower_graph
from k3c.errors import ArtifactError, UsageError
from k3c.ir import OPS, InputError, TensorType


def test_every_ir_op_has_an_onnx_lowering_or_a_decomposition():
    table = L.load("onnx")
    # collectives run between a rank's segments (k3c.distributed), never inside a backend's graph
    assert [op for op in OPS if op not in table and OPS[op].decompose is None
            and "collective" not in OPS[op].families] == []


def test_unsupported_op_names_op_backend_and_reason(tmp_path):
    """The k3c-domain bodies are f32: a bf16 kda is refused by name, before anything is written."""
    bf16 = lambda *s: TensorType("bf16", s)  # noqa: E731
    g = op_graph("kda", [("q", bf16(B_, T_, H, K)), ("k", bf16(B_, T_, H, K)), ("v", bf16(B_, T_, H, V)),
                         ("g", bf16(B_, T_, H, K)), ("beta", bf16(B_, T_, H)), ("S", f32_type(B_, H, K, V))],
                 {"scale": 0.25})
    g.nodes[0].meta["loc"] = "models/kda_layer.py:81"
    with pytest.raises(UnsupportedNodeError) as e:
        OnnxBackend().lower({"forward": g}, tmp_path)
    msg = str(e.value)
    assert "'onnx'" in msg and "kda" in msg and "f32 only" in msg and "models/kda_layer.py:81" in msg
    assert not (tmp_path / "manifest.json").exists()


def test_op_without_lowering_is_named(monkeypatch):
    g = op_graph("gelu", [("x", f32_type(B_, T_, 8))], {"approximate": "none"})
    monkeypatch.delitem(L.load("onnx"), "gelu")
    ok, reason = OnnxBackend().supports(g.nodes[0], g)
    assert not ok and "gelu" in reason
    with pytest.raises(ValueError, match="gelu"):
        lower_graph(g)


@pytest.fixture(scope="module")
def k3_artifact(zoo_artifact):
    return zoo_artifact("k3-tiny", "portable")


def _decode_inputs(runner, B=2, P=5):
    ids = np.zeros((B, 1), np.int64)
    state = []
    for spec in runner.manifest["entries"]["decode"]["inputs"][1:]:
        shape = [B if d == "B" else P if d == "P" else d for d in spec["shape"]]
        state.append(np.zeros(shape, np.float32))
    return ids, state


def test_wrong_state_shape_names_the_input(k3_artifact):
    _, _, _, runner = k3_artifact
    ids, state = _decode_inputs(runner)
    names = [s["name"] for s in runner.manifest["entries"]["decode"]["inputs"][1:]]
    i = names.index("layers.1.S")
    state[i] = np.zeros((2, 4, 33, 32), np.float32)
    with pytest.raises(InputError, match=r"'layers\.1\.S': expected float32\[B, 4, 32, 32\]"):
        runner.run_numpy("decode", ids, *state)
    ids, state = _decode_inputs(runner)
    assert len(runner.run_numpy("decode", ids, *state)) == len(state) + 1  # the right shapes run


def test_inconsistent_batch_names_the_input(k3_artifact):
    _, _, _, runner = k3_artifact
    ids, state = _decode_inputs(runner)
    state[0] = np.zeros((3,) + state[0].shape[1:], np.float32)
    with pytest.raises(InputError, match=r"'layers\.0\.S'.*B=2.*dim 0 is 3, expected 2"):
        runner.run_numpy("decode", ids, *state)


def test_inconsistent_cache_length_names_the_input(k3_artifact):
    _, _, _, runner = k3_artifact
    ids, state = _decode_inputs(runner)
    names = [s["name"] for s in runner.manifest["entries"]["decode"]["inputs"][1:]]
    i = names.index("layers.3.krope")
    state[i] = np.zeros((2, 4, 16), np.float32)  # P = 4 where layers.3.ckv says 5
    with pytest.raises(InputError, match=r"'layers\.3\.krope'.*P=5"):
        runner.run_numpy("decode", ids, *state)


def test_wrong_dtype_and_count(k3_artifact):
    _, _, _, runner = k3_artifact
    ids, state = _decode_inputs(runner)
    with pytest.raises(InputError, match=r"'input_ids': expected int64\[B, 1\], got int32"):
        runner.run_numpy("decode", ids.astype(np.int32), *state)
    with pytest.raises(InputError, match=r"decode takes \d+ inputs \(input_ids, layers\.0\.S"):
        runner.run_numpy("decode", ids, *state[:-1])
    with pytest.raises(InputError, match=r"'input_ids': expected int64\[B, 1\].*dim 1 is 3, expected 1"):
        runner.run("decode", torch.zeros(2, 3, dtype=torch.long), *map(torch.from_numpy, state))


def test_bad_flavour_option_and_directory(tmp_path):
    with pytest.raises(ValueError, match="flavour must be one of portable, ort"):
        OnnxBackend(flavour="tensorrt")
    with pytest.raises(TypeError, match="onnx backend: unknown option.*'arch'.*known: flavour"):
        backends.get("onnx", arch="sm_90")
    with pytest.raises(UsageError, match="onnx target 'rocm': the targets are cpu, cuda"):
        backends.get("onnx", target="rocm")
    with pytest.raises(ArtifactError, match="holds no k3c artifact"):
        OnnxRunner(tmp_path)


def test_token_id_out_of_range_names_the_input(k3_artifact):
    _, _, _, runner = k3_artifact
    assert runner.manifest["entries"]["prefill"]["inputs"][0]["bounds"] == [0, 1024]
    with pytest.raises(InputError, match=r"prefill input 'input_ids': id 1024 is outside \[0, 1024\)"):
        runner.run("prefill", torch.tensor([[5, 1024, 7]]))
