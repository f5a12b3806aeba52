"""k3c's error classes: one per kind of mistake a user can make, all reachable from here.

Each message names the culprit (the input, the state key, the file, the node), so the CLI
prints it as one line and exits 2; anything else that escapes is a bug in k3c.

    K3cError          the base of the kinds defined here
    UsageError        an argument value that cannot work (a CLI flag, a keyword of a public function)
    InputError        a tensor that does not fit an entry point's contract (shape, dtype, id, state key)
    ArtifactError     an artifact folder that is missing, damaged, or holds something else
    CaptureError      a model torch.export or k3c's frontend cannot take (frontend/translate.py)
    UnsupportedNodeError  IR nodes a backend cannot lower (backends/base.py re-exports it)
    VerifyError, ParseError, ShapeError   the IR layer's (defined in k3c.ir)
    CheckpointError   a checkpoint that does not fit its config (defined in k3c.models.checkpoint)

The last four live with the layer that raises them and are re-exported here lazily (this
module imports nothing of k3c, so the kernels can use it without an import cycle);
`user_errors()` is every class the CLI reports as a user's error.
"""

from __future__ import annotations

import importlib


class K3cError(Exception):
    """Something the user asked for cannot be done; the message says what and why."""


class UsageError(K3cError, ValueError):
    """An argument value that cannot work: a CLI flag, a path, a keyword of a public function."""


class ArtifactError(K3cError):
    """An artifact folder that is missing a file, fails its checksum, or holds another artifact."""


class CaptureError(K3cError):
    """The model cannot be captured; the message names what and where."""


class UnsupportedNodeError(K3cError):
    """Nodes a backend cannot lower: each with its op, the reason and the model's line."""

    def __init__(self, backend: str, problems: list):
        self.backend, self.problems = backend, problems
        lines = []
        for node, reason in problems:
            where = f" at {node.loc}" if node.loc else ""
            lines.append(f"  {node.op} (%{node.outputs[0]}){where}: {reason}")
        super().__init__(f"backend {backend!r} cannot lower {len(problems)} node(s):\n" + "\n".join(lines))


# name -> module that defines it (imported on first use: those modules import torch and the IR)
_ELSEWHERE = {
    "InputError": "k3c.ir.interpret",
    "VerifyError": "k3c.ir.verify",
    "ParseError": "k3c.ir.text",
    "ShapeError": "k3c.ir.ops.spec",
    "CheckpointError": "k3c.models.checkpoint",
}


def __getattr__(name: str):
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def user_errors() -> tuple[type, ...]:
    """Every k3c error class: what these say is meant for the user, without a traceback."""
    return (K3cError, *(__getattr__(n) for n in _ELSEWHERE))


__all__ = ["K3cError", "UsageError", "ArtifactError", "CaptureError", "UnsupportedNodeError", "user_errors",
           *_ELSEWHERE]
