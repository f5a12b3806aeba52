"""The fusion-pass example does what it says; `k3c show` dumps the IR after a pass and verifies."""

from __future__ import annotations

import runpy
from pathlib import Path

from k3c import cli, registry
from k3c.ir import OPS
from k3c.passes import PASSES

ROOT = Path(__file__).resolve().parents[2]


def test_write_a_fusion_pass_runs_twice_in_one_process(capsys):
    """A notebook runs a cell twice: every registration of the example replaces its own
    (replace=True), so the second run works and finds the same sites."""
    path = ROOT / "examples" / "write_a_fusion_pass.py"
    with registry.scope():  # what the example registers is gone again after the test
        for run in range(2):
            example = runpy.run_path(str(path), run_name=f"fusion_example_{run}")
            report = example["main"](["--backends", "reference", "--seq-len", "20", "--decode-steps", "1"])
            assert report.ok and list(report.backends) == ["reference"]
    assert "kda_sigmoid_gate" not in OPS and "fuse-kda-gate" not in PASSES
    out = capsys.readouterr().out
    assert out.count("fuse-kda-gate: 6 sites in k3-tiny's prefill; 6 kda_sigmoid_gate nodes") == 2
    assert "onnx user, onnx --flavour ort user, tvm decomposed, triton decomposed" in out


def test_show_dump_after_verify_and_report(capsys):
    assert cli.main(["show", "--model", "gpt2-tiny", "--pipeline", "default", "--dump-after", "cse",
                     "--verify", "--report"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("// IR after cse\ngraph gpt2-tiny.prefill {") and out.count("graph ") == 1
    assert "pass report" in err and "chunk-delta-rule" in err


def test_show_unknown_pass_is_a_one_line_error(capsys):
    assert cli.main(["show", "--model", "gpt2-tiny", "--after", "fuse-everything"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("k3c show: error: stop_after: pass 'fuse-everything' is not in the pipeline")
    assert "\n" not in err
