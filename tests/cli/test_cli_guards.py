"""The CLI checks its argument values before any work and keeps DESIGN.md's exit codes: a
user's error is status 2 with one line, a found difference 1. An empty backend list used to
check nothing and exit 0 (a CI gate fed an empty variable passed); a bad --json path failed
only after the whole run."""

from __future__ import annotations

import json

import pytest
from cli_testlib import fails as _fails

from k3c import backends
from k3c.cli import main


@pytest.mark.parametrize("argv, words", [
    (["diff", "--model", "gpt2-tiny", "--backends", ""], "names no backend"),
    (["diff", "--model", "gpt2-tiny", "--backends", ","], "names no backend"),
    (["compile", "--model", "gpt2-tiny", "--backend", ","], "names no backend"),
    (["bench", "--model", "gpt2-tiny", "--backends", " , "], "names no backend"),
    (["diff", "--model", "gpt2-tiny", "--backends", "tvm:ort"], "has no flavours (only onnx"),
    (["diff", "--model", "gpt2-tiny", "--backends", "onnx", "--flavour", "fast"], "unknown ONNX flavour"),
    (["diff", "--model", "gpt2-tiny", "--backends", "onnx", "--flavour", ","], "names no flavour"),
    (["diff", "--model", "gpt2-tiny", "--backends", "reference", "--stress", "hot"], "unknown stress 'hot'"),
], ids=["diff-empty", "diff-comma", "compile-comma", "bench-blank", "flavour-on-tvm", "bad-flavour",
        "empty-flavour", "bad-stress"])
def test_bad_values_fail_before_any_work(argv, words, capsys, no_work):
    _fails(argv, capsys, words)


@pytest.mark.parametrize("flag", ["--decode-steps", "--seq-len", "--batch"])
def test_counts_are_checked_by_the_parser(flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(["diff", "--model", "gpt2-tiny", "--backends", "reference", flag, "-2"])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "must be >=" in err[0]


def test_output_paths_are_checked_first(tmp_path, capsys, no_work):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    _fails(["diff", "--model", "gpt2-tiny", "--backends", "reference", "--json", str(tmp_path)], capsys,
           "is a folder")
    _fails(["diff", "--model", "gpt2-tiny", "--backends", "reference", "--json", str(tmp_path / "no" / "d.json")],
           capsys, "does not exist")
    _fails(["bench", "--model", "gpt2-tiny", "--backends", "reference", "--plot", str(tmp_path / "no" / "p.png")],
           capsys, "does not exist")
    _fails(["show", "--model", "gpt2-tiny", "--dot", str(tmp_path)], capsys, "is a folder")
    _fails(["compile", "--model", "gpt2-tiny", "--backend", "reference", "--out", str(afile)], capsys, "is a file")
    _fails(["diff", "--model", "gpt2-tiny", "--backends", "reference", "--out", str(afile)], capsys, "is a file")


def test_out_holding_another_artifact_needs_force(tmp_path, capsys):
    out = tmp_path / "art"
    assert main(["compile", "--model", "gpt2-tiny", "--backend", "reference", "--out", str(out)]) == 0
    _fails(["compile", "--model", "linear-attn-tiny", "--backend", "reference", "--out", str(out)], capsys,
           "pass --force")
    assert main(["compile", "--model", "linear-attn-tiny", "--backend", "reference", "--out", str(out),
                 "--force"]) == 0
    assert json.loads((out / "manifest.json").read_text())["artifact"]["model"] == "linear-attn-tiny"


def test_a_stress_the_model_cannot_take_is_a_users_error(capsys):
    _fails(["diff", "--model", "gpt2-tiny", "--backends", "reference", "--stress", "router-low"], capsys,
           "needs a model with a MoE router")


def test_a_found_difference_exits_1(tmp_path, capsys):
    from test_diff import PerturbedBackend  # the reference backend with one wrong kernel

    backends.register("perturbed", PerturbedBackend)
    code = main(["diff", "--model", "deltanet-tiny", "--backends", "reference,perturbed", "--seq-len", "20",
                 "--decode-steps", "1", "--pipeline", "none", "--json", str(tmp_path / "d.json")])
    assert code == 1
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["backends"]["reference"]["ok"] and not data["backends"]["perturbed"]["ok"]


def test_compile_all_checks_the_flavour_asked_for(tmp_path, capsys):
    code = main(["compile", "--model", "gpt2-tiny", "--backend", "reference,onnx", "--flavour", "ort",
                 "--seq-len", "8", "--out", str(tmp_path)])
    assert code == 0
    rows = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[3:] if ln.strip()]
    assert rows[:2] == ["reference", "onnx:ort"]  # the ort flavour was built and checked, not the portable one
    import json

    manifest = json.loads((tmp_path / "onnx-ort" / "manifest.json").read_text())
    assert manifest["flavour"] == "ort"


def test_compile_onnx_defaults_to_the_portable_flavour(tmp_path):
    import json

    assert main(["compile", "--model", "gpt2-tiny", "--backend", "onnx", "--out", str(tmp_path / "o")]) == 0
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["flavour"] == "portable"
