"""Fixtures of the serving tests: artifacts of captured graphs, built once a module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import k3c
from k3c.backends import artifact
from k3c.compiler import CompiledModel, prepare


def build(backend: str, graphs: dict, out: Path) -> CompiledModel:
    """Lower `graphs` (as captured) for `backend` into `out` and load it, as k3c.compile does."""
    be = k3c.backends.get(backend)
    graphs = prepare(graphs, be)
    artifact.write(be, graphs, out, force=True)
    return CompiledModel(be.load(out), graphs, out, backend)


CAPACITY = 305  # one cache capacity for every serving test: a model is captured once a session


@pytest.fixture(scope="session")
def fixed_graphs():
    """model -> its graphs captured with fixed caches of CAPACITY rows (once per model name)."""
    cache: dict[str, dict] = {}

    def get(model) -> dict:
        if model.name not in cache:
            ids = torch.zeros(2, 16, dtype=torch.long)
            cache[model.name] = k3c.capture_entries(model, (ids,), max_context=CAPACITY)
        return dict(cache[model.name])

    return get
