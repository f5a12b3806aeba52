"""Whole models through the Triton backend under the interpreter: k3-tiny (the canonical
model: prefill at T = 1 and 65, then a decode step) equals eager, logits and every state
tensor; its generated source matches the golden snapshot; the rest of the tiny zoo runs;
`k3c.compile` and `k3c compile` give a callable and a module on disk.

Regenerate the snapshot after an intended change of the generated code with
    K3C_UPDATE_GOLDEN=1 pytest tests/triton/test_triton_model.py -k golden
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import TINY, example_ids

import k3c
from k3c.backends.triton import MODULE_FILE, TritonBackend
from k3c.compiler import CompiledModel
from k3c.numerics import assert_close

GOLDEN = Path(__file__).parent / "golden" / "k3-tiny.py"


def compile_graphs(zoo, name: str, out: Path) -> tuple[torch.nn.Module, CompiledModel]:
    """The zoo's captured graphs of `name` through the default pipeline and the Triton backend."""
    model, prefill, decode = zoo(name)
    graphs = {"prefill": k3c.passes.run(prefill, "default"), "decode": k3c.passes.run(decode, "default")}
    backend = TritonBackend()
    backend.lower(graphs, out)
    return model, CompiledModel(backend.load(out), graphs, out, "triton")


def assert_same_step(got: tuple, expected: tuple, what: str) -> None:
    """Logits and every state tensor; the compiled side may live on the GPU."""
    (logits, state), (logits_ref, state_ref) = got, expected
    assert_close(logits.cpu(), logits_ref, what=f"{what} logits")
    assert state.keys() == state_ref.keys()
    for name in state_ref:
        assert_close(state[name].cpu(), state_ref[name], what=f"{what} state {name}")


@pytest.fixture(scope="module")
def k3_tiny(zoo, tmp_path_factory):
    return compile_graphs(zoo, "k3-tiny", tmp_path_factory.mktemp("k3-tiny-triton"))


@pytest.fixture(scope="module")
def k3_tiny_prefill_65(k3_tiny):
    """(triton, eager) prefill of k3-tiny at B = 1, T = 65 (two chunks of 64), run once."""
    model, compiled = k3_tiny
    ids = example_ids(model, 1, 65, seed=1)
    with torch.no_grad():
        return compiled.prefill(ids), model.prefill(ids)


def test_k3_tiny_prefill_T65_equals_eager(k3_tiny_prefill_65):
    assert_same_step(*k3_tiny_prefill_65, "prefill T=65")


def test_k3_tiny_prefill_T1_batch2_equals_eager(k3_tiny):
    model, compiled = k3_tiny
    ids = example_ids(model, 2, 1, seed=2)
    with torch.no_grad():
        assert_same_step(compiled.prefill(ids), model.prefill(ids), "prefill T=1")


def test_k3_tiny_decode_after_prefill_equals_eager(k3_tiny, k3_tiny_prefill_65):
    model, compiled = k3_tiny
    (_, state), (_, state_ref) = k3_tiny_prefill_65
    ids = example_ids(model, 1, 1, seed=3)
    with torch.no_grad():
        assert_same_step(compiled.decode(ids, state), model.decode(ids, state_ref), "decode after T=65")


def test_k3_tiny_generated_source_matches_the_golden_snapshot(k3_tiny):
    source = (k3_tiny[1].out_dir / MODULE_FILE).read_text()
    if os.environ.get("K3C_UPDATE_GOLDEN"):
        GOLDEN.write_text(source)
    assert GOLDEN.exists(), "no golden snapshot yet: run with K3C_UPDATE_GOLDEN=1"
    assert source == GOLDEN.read_text(), (
        "the generated Triton module of k3-tiny changed; if intended, regenerate the snapshot with "
        "K3C_UPDATE_GOLDEN=1 pytest tests/triton/test_triton_model.py -k golden")


@pytest.mark.parametrize("name", [n for n in TINY if n != "k3-tiny"])
def test_every_tiny_zoo_model_runs_through_triton(zoo, name, tmp_path):
    """Prefill at T = 20 (the chunked kernels) and one decode step, B = 1, against eager."""
    model, compiled = compile_graphs(zoo, name, tmp_path)
    ids = example_ids(model, 1, 21, seed=4)
    with torch.no_grad():
        got, ref = compiled.prefill(ids[:, :20]), model.prefill(ids[:, :20])
        assert_same_step(got, ref, f"{name} prefill")
        assert_same_step(compiled.decode(ids[:, 20:], got[1]), model.decode(ids[:, 20:], ref[1]), f"{name} decode")


def test_k3c_compile_returns_a_callable(tmp_path):
    model = k3c.models.build("gated-deltanet-tiny")
    ids = example_ids(model, 2, 18)
    compiled = k3c.compile(model, "triton", (ids,), out_dir=tmp_path)
    with torch.no_grad():
        assert_close(compiled(ids).cpu(), model(ids), what="logits")
    assert (tmp_path / MODULE_FILE).exists()


def test_cli_compile_writes_the_module(tmp_path):
    """`k3c compile` in a fresh process that chose no Triton mode: k3c must choose it before
    torch.export imports triton while capturing (the interpreter here, the GPU on a GPU box)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "k3c.cli", "compile", "--model", "deltanet-tiny", "--backend", "triton",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    source = (tmp_path / MODULE_FILE).read_text()
    assert "def prefill(W, input_ids):" in source and "def decode(W, input_ids" in source
    assert {p.name for p in tmp_path.iterdir()} >= {MODULE_FILE, "weights.safetensors", "manifest.json",
                                                    "prefill.k3c", "decode.k3c"}
