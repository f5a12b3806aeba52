"""The fusion-pass example does what it says; `k3c show` dumps the IR after a pass and verifies."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from k3c import cli, ir
from k3c.passes import PASSES

ROOT = Path(__file__).resolve().parents[2]


def test_write_a_fusion_pass_example(zoo, capsys):
    """The example's own check on the session's k3-tiny graph (the script adds only the
    capture); what it declares and registers is taken back afterwards."""
    ops, passes_before = set(ir.OPS), set(PASSES)
    try:
        path = ROOT / "examples" / "write_a_fusion_pass.py"
        spec = importlib.util.spec_from_file_location("write_a_fusion_pass", path)
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        assert example.check(zoo("k3-tiny")[1]) == 6
    finally:
        for name in set(ir.OPS) - ops:
            del ir.OPS[name]
            for members in ir.FAMILIES.values():
                members.discard(name)
        for name in set(PASSES) - passes_before:
            del PASSES[name]
    assert "fuse-gated-rms-norm: 6 sites on k3-tiny; interpreter before == after" in capsys.readouterr().out


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
