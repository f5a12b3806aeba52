"""Fixtures of the serving tests: artifacts of captured graphs, built once a module."""

from __future__ import annotations

from pathlib import Path

import k3c
from k3c.backends import artifact
from k3c.compiler import CompiledModel, prepare


def build(backend: str, graphs: dict, out: Path) -> CompiledModel:
    """Lower `graphs` (as captured) for `backend` into `out` and load it, as k3c.compile does."""
    be = k3c.backends.get(backend)
    graphs = prepare(graphs, be)
    artifact.write(be, graphs, out, force=True)
    return CompiledModel(be.load(out), graphs, out, backend)
