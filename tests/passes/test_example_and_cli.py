"""The fusion-pass example runs as a script; `k3c show` dumps the IR after a pass and verifies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from k3c import cli

ROOT = Path(__file__).resolve().parents[2]


def test_write_a_fusion_pass_example_runs():
    # its own process: the example declares an op and registers a pass for good
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "write_a_fusion_pass.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fuse-gated-rms-norm: 6 sites on k3-tiny; interpreter before == after" in done.stdout


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
