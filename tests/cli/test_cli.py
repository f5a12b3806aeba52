"""Smoke tests of the `k3c` command: each subcommand runs, errors are one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from k3c.cli import main


def test_stats(capsys):
    assert main(["stats", "--model", "k3-tiny", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "MLA latent cache" in out


def test_ops_prints_one_row_per_op(capsys):
    from k3c.ir.ops import OPS

    assert main(["ops"]) == 0
    table, _, forms = capsys.readouterr().out.strip().partition("\n\n")
    rows = table.splitlines()[1:]
    assert sorted(r.split()[1] for r in rows) == sorted(OPS)
    # the ONNX bodies chosen by an attribute are listed under the table, one op a line
    assert forms.startswith("forms chosen by attribute:")
    assert any(line.split()[:2] == ["onnx", "gated_mlp:"] for line in forms.splitlines())


def test_show_prints_ir_that_parses(capsys):
    from k3c.ir import parse, verify

    assert main(["show", "--model", "gpt2-tiny"]) == 0
    verify(parse(capsys.readouterr().out))


def test_show_dot(tmp_path, capsys):
    assert main(["show", "--model", "gpt2-tiny", "--entry", "decode", "--dot", str(tmp_path / "g.dot")]) == 0
    text = (tmp_path / "g.dot").read_text()
    assert text.startswith('digraph "gpt2-tiny.decode"') and "causal_attention" in text


def test_compile_reference_writes_an_artifact(tmp_path, capsys):
    assert main(["compile", "--model", "gpt2-tiny", "--backend", "reference", "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "prefill" / "graph.k3c").exists()
    assert (tmp_path / "a" / "decode" / "weights.safetensors").exists()


def test_diff_json_and_exit_status(tmp_path, capsys):
    path = tmp_path / "d.json"
    code = main(["diff", "--model", "gpt2-tiny", "--backends", "reference", "--seq-len", "20",
                 "--decode-steps", "2", "--json", str(path), "--out", str(tmp_path / "art")])
    assert code == 0
    data = json.loads(path.read_text())
    assert data["model"] == "gpt2-tiny"
    ref = data["backends"]["reference"]
    assert ref["ok"] is True and ref["max_abs_err"] < 1e-4 and ref["rel_rms_err"] < 1e-5


def test_bench_json_and_plot(tmp_path, capsys):
    code = main(["bench", "--model", "gpt2-tiny", "--backends", "reference", "--seq-len", "16", "--decode-steps",
                 "2", "--warmup", "0", "--repeats", "1", "--no-torch-compile", "--json", str(tmp_path / "b.json"),
                 "--plot", str(tmp_path / "b.png"), "--out", str(tmp_path / "art")])
    assert code == 0
    data = json.loads((tmp_path / "b.json").read_text())
    assert set(data["backends"]) == {"eager", "reference"}
    assert data["backends"]["reference"]["ratio_vs_eager"] > 0
    assert data["shapes"]["prefill_len"] == 16 and data["machine"]["cpus"]
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, words", [
    (["stats", "--model", "nope"], "unknown model 'nope'"),
    (["show", "--model", "k3-tiny", "--pipeline", "fastest"], "fastest"),
    (["diff", "--model", "gpt2-tiny", "--backends", "reference,cuda-graphs"], "unknown backend"),
], ids=["unknown-model", "unknown-pipeline", "unknown-backend"])
def test_errors_are_one_line_without_traceback(argv, words):
    proc = subprocess.run([sys.executable, "-m", "k3c.cli", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
    assert len(lines) == 1, proc.stderr
    assert words in lines[0] and "Traceback" not in proc.stderr
