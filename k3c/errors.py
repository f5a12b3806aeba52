"""k3c's error classes: one per kind of mistake a user can make, all reachable from here.

Each message names the culprit (the input, the state key, the file, the node), so the CLI
prints it as one line and exits 2; anything else that escapes is a bug in k3c.

    K3cError          the base of the kinds defined here
    UsageError        an argument value that cannot work (a CLI flag, a keyword of a public function)
    InputError        a tensor that does not fit an entry point's contract (shape, dtype, id, state key)
    ArtifactError     an artifact folder that is missing, damaged, or holds something else
      ManifestError   a manifest field that is missing, of the wrong kind or out of range (the field)
    CaptureError      a model torch.export or k3c's frontend cannot take (frontend/translate.py)
    UnsupportedNodeError  IR nodes a backend cannot lower (backends/base.py re-exports it)
    ParseError        malformed IR text (the line)
    ShapeError        an op's operands that do not fit (the rule)
    VerifyError       a graph the verifier rejects (the node, the rule, the model line)
    CheckpointError   a checkpoint that does not fit its config (the file or keys)
    RewriteError      rewrite rules or decompositions that never settle (the rule or op)

This module imports nothing of k3c, so every layer (the kernels and the IR included) raises
its errors from here; `user_errors()` is what the CLI reports as a user's error.
"""

from __future__ import annotations


class K3cError(Exception):
    """Something the user asked for cannot be done; the message says what and why."""


class UsageError(K3cError, ValueError):
    """An argument value that cannot work: a CLI flag, a path, a keyword of a public function."""


class ArtifactError(K3cError):
    """An artifact folder that is missing a file, fails its checksum, or holds another artifact."""


class ManifestError(ArtifactError):
    """A manifest that is not the shape k3c writes: names the file and the field."""


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


class InputError(K3cError, ValueError):
    """A tensor that does not fit an entry point's contract; the message names the input."""


class ParseError(K3cError, ValueError):
    """Malformed IR text: the line number, the line and what is wrong with it."""

    def __init__(self, lineno: int, line: str, message: str):
        super().__init__(f"line {lineno}: {message}\n    {line.strip()}")
        self.lineno = lineno


class ShapeError(K3cError):
    """An op's operands do not fit: `rule` names the broken rule."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


class VerifyError(K3cError):
    """A graph the verifier rejects: the node, the broken rule and the model's line."""

    def __init__(self, rule: str, message: str, node=None):
        self.rule, self.node = rule, node
        where = f"node {node.describe()}: " if node is not None else ""
        super().__init__(f"{where}[{rule}] {message}")


class CheckpointError(K3cError, ValueError):
    """A checkpoint that cannot be read as the model its config describes: names the file or keys."""


class RewriteError(K3cError):
    """Rules that keep matching what they build, or an op whose decomposition needs itself:
    the message names the rule or the ops of the cycle."""


def user_errors() -> tuple[type, ...]:
    """Every k3c error class: what these say is meant for the user, without a traceback."""
    return (K3cError,)


__all__ = ["K3cError", "UsageError", "ArtifactError", "ManifestError", "CaptureError", "UnsupportedNodeError",
           "InputError", "ParseError", "ShapeError", "VerifyError", "CheckpointError", "RewriteError", "user_errors"]
