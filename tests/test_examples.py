"""The examples run as a user runs them (a fresh interpreter, from the repository root), and
every file of examples/ is run by some test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_write_a_fusion_pass_reaches_every_backend():
    """The example's fused op goes through ONNX by its own lowering and through TVM and Triton
    by its decomposition, and each artifact matches eager (the reference run is in
    tests/passes/test_example_and_cli.py)."""
    r = subprocess.run([sys.executable, "examples/write_a_fusion_pass.py", "--backends", "onnx,tvm,triton"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines() if line.split()[:1] in
            (["onnx"], ["tvm"], ["triton"])}
    assert rows == {"onnx": "yes", "tvm": "yes", "triton": "yes"}, r.stdout
    assert "onnx user" in r.stdout and "tvm decomposed" in r.stdout


def test_prefix_reuse_matches_a_prefill_from_scratch():
    r = subprocess.run([sys.executable, "examples/prefix_reuse.py", "--backend", "onnx"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("prefix of 40 reused") == 2, r.stdout


def test_every_example_is_run_by_a_test():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for example in sorted((ROOT / "examples").glob("*.py")):
        assert example.name in tests, f"examples/{example.name} is not run by any test"
