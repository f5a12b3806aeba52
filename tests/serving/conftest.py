"""Fixtures of the serving tests: graphs captured with fixed caches, once a session."""

from __future__ import annotations

import pytest
import torch
from serving_testlib import CAPACITY

import k3c
from k3c.backend_spec import parse_backend
from k3c.backends import artifact
from k3c.compiler import CompiledModel, prepare


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


@pytest.fixture(scope="module")
def compiled(fixed_graphs, tmp_path_factory):
    """(backend, model name) -> (model, CompiledModel with fixed caches of CAPACITY rows), built
    once a test module."""
    cache: dict = {}

    def get(backend: str, name: str):
        if (backend, name) not in cache:
            model = k3c.models.build(name).eval()
            spec = parse_backend(backend)
            be = k3c.backends.get(spec.name, **spec.options())
            graphs = prepare(fixed_graphs(model), be)
            out = tmp_path_factory.mktemp(f"{name}-{backend.replace(':', '-')}")
            artifact.write(be, graphs, out, force=True)
            cache[backend, name] = model, CompiledModel(be.load(out), graphs, out, backend)
        return cache[backend, name]

    return get
