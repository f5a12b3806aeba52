"""Helpers of the security tests: one tiny fixed-cache model, its artifacts, and edits of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from k3c.ir import dims as D

CAPACITY = 32  # the caches' rows: a position of 100000 or -1 must never reach a cache write
MODEL = "gpt2-tiny"  # ids index its vocabulary, positions its caches, lengths its prompts
T = 4


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def write_manifest(folder: Path, m: object) -> None:
    (folder / "manifest.json").write_text(json.dumps(m))


def edit_manifest(folder: Path, edit) -> None:
    """Apply `edit(manifest)` in place."""
    m = manifest(folder)
    edit(m)
    write_manifest(folder, m)


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def zeros_like_type(t, B: int = 1) -> torch.Tensor:
    """A tensor of IR type `t` with batch B, all zeros (the checks run before any kernel)."""
    shape = [D.evaluate(d, {"B": B, "T": T}) for d in t.shape]
    return torch.zeros(shape, dtype=t.torch_dtype)


def decode_inputs(graphs: dict, position: int, token: int = 0) -> list[torch.Tensor]:
    """The decode entry's inputs: one token id, zero caches and `positions` = [position]."""
    g = graphs["decode"]
    xs = [torch.tensor([[token]])] + [zeros_like_type(g.types[n]) for n in g.inputs[1:]]
    xs[g.inputs.index("positions")] = torch.tensor([position])
    return xs


def extend_inputs(graphs: dict, position: int, length: int) -> list[torch.Tensor]:
    """The extend entry's inputs: T token ids, zero caches, `positions` and `lengths`."""
    g = graphs["extend"]
    xs = [torch.ones(1, T, dtype=torch.long)] + [zeros_like_type(g.types[n]) for n in g.inputs[1:]]
    xs[g.inputs.index("positions")] = torch.tensor([position])
    xs[g.inputs.index("lengths")] = torch.tensor([length])
    return xs
