"""The examples run as a user runs them (a fresh interpreter, from the repository root), and
every file of examples/ is run by some test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_diff_my_model_passes_on_every_backend(tmp_path):
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "examples/diff_my_model.py", "--decode-steps", "2", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["model"] == "my-hybrid" and report["ok"]
    assert sorted(report["backends"]) == ["onnx", "reference", "triton", "tvm"]
    for name, b in report["backends"].items():
        assert b["tensors"], f"{name} compared nothing"
        names = {t["name"] for t in b["tensors"]}
        assert {"prefill/logits", "prefill/blocks.0.S", "final/blocks.2.ckv", "decode1/logits"} <= names, name


def _fusion_pass_example(backends: str) -> dict[str, str]:
    r = subprocess.run([sys.executable, "examples/write_a_fusion_pass.py", "--backends", backends],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "onnx user" in r.stdout and "tvm decomposed" in r.stdout, r.stdout  # how each backend runs the op
    return {line.split()[0]: line.split()[1] for line in r.stdout.splitlines() if line.split()[:1] in
            (["onnx"], ["tvm"], ["triton"])}


def test_write_a_fusion_pass_reaches_onnx_and_triton():
    """The example's fused op goes through ONNX by its own lowering and through Triton by its
    decomposition, and each artifact matches eager (the reference run is in
    tests/passes/test_example_and_cli.py)."""
    assert _fusion_pass_example("onnx,triton") == {"onnx": "yes", "triton": "yes"}


@pytest.mark.slow  # a TVM build of k3-tiny with the user's op: minutes on two cores
def test_write_a_fusion_pass_reaches_tvm():
    assert _fusion_pass_example("tvm") == {"tvm": "yes"}


def test_prefix_reuse_matches_a_prefill_from_scratch():
    r = subprocess.run([sys.executable, "examples/prefix_reuse.py", "--backend", "onnx"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("prefix of 40 reused") == 2, r.stdout


def test_serve_loop_equals_plain_greedy(tmp_path):
    """examples/serve_loop.py (slots, prefix reuse, speculative verify over onnxruntime) gives
    each request the tokens of plain greedy generation by the eager model, the prompt alone."""
    import torch

    import k3c
    from k3c.generate import EagerRunner, generate

    r = subprocess.run([sys.executable, "examples/serve_loop.py", str(tmp_path / "k3-tiny-onnx")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    assert report["calls"]["prefill"] == 1, "the shared prefix is prefilled once"
    assert report["calls"]["decode"] > 0 and report["verify_steps"] > 0 and report["accepted"] > 0, report
    assert report["most_busy"] == 2, report
    late = report["requests"][2]  # arrives at step 1, both slots busy: waits for a retired one's slot
    assert late["admitted"] > 1 and late["slot"] in (report["requests"][0]["slot"], report["requests"][1]["slot"])
    model = k3c.models.build("k3-tiny").eval()
    for i, req in enumerate(report["requests"]):
        with torch.no_grad():
            want, _ = generate(EagerRunner(model, 96), [req["prompt"]], len(req["generated"]))
        assert req["generated"] == want[0], f"request {i}: serve loop {req['generated']} != greedy {want[0]}"


def test_every_example_is_run_by_a_test():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for example in sorted((ROOT / "examples").glob("*.py")):
        assert example.name in tests, f"examples/{example.name} is not run by any test"
