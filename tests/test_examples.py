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


def test_every_example_is_run_by_a_test():
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    for example in sorted((ROOT / "examples").glob("*.py")):
        assert example.name in tests, f"examples/{example.name} is not run by any test"
