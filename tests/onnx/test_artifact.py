"""The artifact as a user meets it: files and manifest, ONNX metadata, external weights
shared by both graphs, `k3c compile --backend onnx`, `k3c.compile(..., backend="onnx")`, and
examples/onnx_generate.py driving generation with onnxruntime alone."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from factories import example_ids

import k3c
from k3c.numerics import assert_close

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "onnx_generate.py"


def test_files_manifest_and_metadata(zoo_artifact):
    model, graphs, out, _ = zoo_artifact("k3-tiny", "ort")
    assert sorted(p.name for p in out.iterdir()) == ["decode.onnx", "extend.onnx", "manifest.json", "prefill.onnx",
                                                     "weights.bin"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["model"] == "k3-tiny" and m["flavour"] == "ort"
    imported = {e: next(o.version for o in onnx.load(str(out / f"{e}.onnx"), load_external_data=False).opset_import
                        if o.domain == "") for e in ("prefill", "decode", "extend")}
    assert m["opset"] == max(imported.values()) == 23  # the grown cache needs no opset-24 op
    assert {e: m["entries"][e]["opset"] for e in imported} == imported
    assert m["pipeline"] == graphs["prefill"].meta["pipeline"]  # the default, as the ort flavour runs it
    assert any(step.startswith("chunk-delta-rule{keep=") for step in m["pipeline"])
    assert m["config"]["hidden_size"] == 256 and m["config"]["attn_res_block_size"] == 3
    assert m["k3c_version"] == k3c.__version__
    assert m["entries"]["prefill"]["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": ["B", "T"],
                                                  "bounds": [0, 1024]}]
    assert m["entries"]["prefill"]["outputs"][0] == {"name": "logits", "dtype": "float32", "shape": ["B", "T", 1024]}
    assert m["dims"] == {"B": [1, None], "T": [1, None], "P": [1, None]}
    props = {p.key: p.value for p in onnx.load(str(out / "decode.onnx"), load_external_data=False).metadata_props}
    assert props["k3c.model"] == "k3-tiny" and props["k3c.entry"] == "decode" and props["k3c.flavour"] == "ort"
    assert json.loads(props["k3c.config"])["num_layers"] == 9 and json.loads(props["k3c.pipeline"]) == m["pipeline"]
    assert props["k3c.version"] == k3c.__version__


def test_weights_are_external_and_shared(zoo_artifact):
    _, graphs, out, _ = zoo_artifact("k3-tiny", "portable")
    sizes, external = {}, 0
    for entry in graphs:
        m = onnx.load(str(out / f"{entry}.onnx"), load_external_data=False)
        assert (out / f"{entry}.onnx").stat().st_size < 1 << 20  # the graph, not the weights
        for t in m.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                assert info["location"] == "weights.bin"
                sizes[t.name] = int(info["length"])
                external += int(info["length"])
            else:
                assert len(t.raw_data) < 1024, f"{t.name} is large but inline"
    assert "model.embed_tokens.weight" in sizes
    assert any(name.endswith(".T") for name in sizes)  # linear weights are stored transposed
    stored = (out / "weights.bin").stat().st_size
    assert stored < 0.6 * external  # both graphs read the same tensors; each is stored once


def test_cli_compile_writes_the_artifact(tmp_path, capsys):
    from k3c.cli import main

    out = tmp_path / "art"
    assert main(["compile", "--model", "linear-attn-tiny", "--backend", "onnx", "--out", str(out),
                 "--flavour", "ort"]) == 0
    assert {"prefill.onnx", "decode.onnx", "weights.bin", "manifest.json"} <= {p.name for p in out.iterdir()}
    m = json.loads((out / "manifest.json").read_text())
    from k3c.backends.onnx import OnnxBackend

    # the ort flavour takes the recurrent ops whole: the pipeline it ran says so
    ran = k3c.passes.for_backend(k3c.passes.steps_of("default"), **k3c.passes.backend_choices(OnnxBackend("ort")))
    assert m["flavour"] == "ort" and m["model"] == "linear-attn-tiny" and m["pipeline"] == ran
    assert ('chunk-delta-rule{keep=["delta_rule", "gated_delta_rule", "kda", "linear_attention"], chunk_size=32}'
            in ran), ran
    assert m["state"] == ["layers.0.S", "layers.0.z", "layers.1.S", "layers.1.z"]
    for entry in ("prefill", "decode"):
        onnx.checker.check_model(str(out / f"{entry}.onnx"), full_check=True)


def test_compile_returns_an_onnxruntime_callable(tmp_path):
    model = k3c.models.build("linear-attn-tiny")
    ids = example_ids(model, 2, 40, seed=3)
    compiled = k3c.compile(model, "onnx", (ids[:, :16],), out_dir=tmp_path, backend_options={"flavour": "ort"})
    from k3c.backends.onnx import OnnxRunner

    assert isinstance(compiled.runner, OnnxRunner)
    assert compiled.runner.providers[-1] == "CPUExecutionProvider"
    with torch.no_grad():
        want_logits, want_state = model.prefill(ids[:, :37])
        step_logits, step_state = model.decode(ids[:, 37:38], want_state)
    assert_close(compiled(ids[:, :37]), want_logits, what="compiled(ids)")
    logits, state = compiled.prefill(ids[:, :37])
    logits, state = compiled.decode(ids[:, 37:38], state)
    assert_close(logits, step_logits, what="compiled.decode logits")
    for k, v in step_state.items():
        assert_close(state[k], v, what=f"compiled.decode state {k}")


def test_example_imports_only_onnxruntime_numpy_json():
    tree = ast.parse(EXAMPLE.read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
           for a in n.names}
    assert top == {"json", "sys", "numpy", "onnxruntime"}


def test_example_generates_what_eager_does(zoo_artifact):
    """The example's greedy tokens (onnxruntime alone) equal eager greedy decoding."""
    model, _, out, _ = zoo_artifact("k3-tiny", "portable")
    run = subprocess.run([sys.executable, str(EXAMPLE), str(out), "--tokens", "6"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    ids = torch.tensor([result["prompt"]])
    tokens = []
    with torch.no_grad():
        logits, state = model.prefill(ids)
        for _ in range(6):
            tokens.append(int(logits[0, -1].argmax()))
            logits, state = model.decode(torch.tensor([[tokens[-1]]]), state)
    assert result["generated"] == tokens


@pytest.mark.parametrize("flavour", ["portable", "ort"])
def test_plain_onnxruntime_session_matches_runner(flavour, zoo_artifact):
    """No k3c at run time: an InferenceSession on prefill.onnx gives the runner's outputs."""
    import onnxruntime as ort

    model, _, out, runner = zoo_artifact("kimi-linear-tiny", flavour)
    ids = example_ids(model, 2, 33, seed=5).numpy()
    sess = ort.InferenceSession(str(out / "prefill.onnx"), providers=["CPUExecutionProvider"])
    plain = sess.run(None, {"input_ids": ids})
    ours = runner.run_numpy("prefill", ids)
    for a, b in zip(plain, ours):
        np.testing.assert_array_equal(a, b)
