"""Helpers of the serving tests (a module of its own: `conftest` is a name every test folder uses)."""

from __future__ import annotations

from pathlib import Path

import k3c
from k3c.backends import artifact
from k3c.compiler import CompiledModel, prepare

CAPACITY = 305  # one cache capacity for every serving test: a model is captured once a session


def build(backend: str, graphs: dict, out: Path) -> CompiledModel:
    """Lower `graphs` (as captured) for `backend` into `out` and load it, as k3c.compile does."""
    be = k3c.backends.get(backend)
    graphs = prepare(graphs, be)
    artifact.write(be, graphs, out, force=True)
    return CompiledModel(be.load(out), graphs, out, backend)
