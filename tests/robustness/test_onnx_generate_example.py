"""examples/onnx_generate.py on a folder of another backend's artifact says so in one line
(it was a KeyError on manifest["entries"]["prefill"]["file"])."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "onnx_generate.py"


def test_a_tvm_artifact_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"artifact": {"backend": "tvm", "model": "k3-tiny"},
                                                        "entries": {"prefill": {}, "decode": {}}}))
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"{tmp_path} holds a tvm artifact, not k3c's ONNX one (prefill.onnx, "
                                             "decode.onnx): compile with --backend onnx"]


def test_a_manifest_that_is_not_json_is_named(tmp_path):
    (tmp_path / "manifest.json").write_text("{")
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "manifest.json: cannot read it as JSON" in r.stderr
