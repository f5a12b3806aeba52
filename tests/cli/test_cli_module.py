"""`--model FILE.py:NAME`: a user's own module on the command line, with its example inputs
and the dims to take as dynamic; the command prints the dims the capture took."""

from __future__ import annotations

import json

import pytest

from k3c.cli import main

SOURCE = '''
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 16)

    def forward(self, x):
        return torch.tanh(self.proj(x))
'''


@pytest.fixture
def block(tmp_path):
    path = tmp_path / "my_block.py"
    path.write_text(SOURCE)
    return f"{path}:Block"


def test_show_takes_the_named_dims_and_says_so(block, capsys):
    assert main(["show", "--model", block, "--inputs", "x=f32[6,32]", "--dims", "x=N _"]) == 0
    out, err = capsys.readouterr()
    assert "input %x: f32[N, 32]" in out and "dynamic dims: forward: x [N _] (dims=)" in err


def test_compile_records_the_dims_in_the_artifact(block, tmp_path, capsys):
    out_dir = tmp_path / "art"
    assert main(["compile", "--model", block, "--backend", "onnx", "--inputs", "x=f32[6,32]",
                 "--out", str(out_dir)]) == 0
    assert "dynamic dims: forward: x [B _] (the default)" in capsys.readouterr().out
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["entries"]["forward"]["dynamic"] == {"x": "B _"}


@pytest.mark.parametrize("extra, words", [
    (["--inputs", "x=f32[6,32]", "--dims", "x=N M"], ["input 'x'", "dim 1", "fixes M at 32"]),
    ([], ["--inputs"]),
    (["--inputs", "x=float[6,32]"], ["'x=float[6,32]'", "dtype"]),
], ids=["static-dim-named", "no-inputs", "bad-dtype"])
def test_a_bad_module_argument_is_one_line_exit_2(block, capsys, extra, words):
    assert main(["show", "--model", block, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
