"""Fixtures of the security tests: the tiny model captured once with fixed caches, and its
artifact per backend built once a session (tests break copies of it)."""

from __future__ import annotations

import pytest
import torch
from security_testlib import CAPACITY, MODEL, T, copy_of

import k3c
from k3c.backends import artifact
from k3c.compiler import prepare
from k3c.serving import with_last_entry


@pytest.fixture(scope="session")
def fixed_graphs():
    model = k3c.models.build(MODEL)
    return with_last_entry(k3c.capture_entries(model, (torch.zeros(1, T, dtype=torch.long),), max_context=CAPACITY))


@pytest.fixture(scope="session")
def built(tmp_path_factory, fixed_graphs):
    """backend -> (artifact folder, the graphs it was lowered from), built on first use."""
    cache: dict[str, tuple] = {}

    def get(backend: str):
        if backend not in cache:
            be = k3c.backends.get(backend)
            graphs = prepare(dict(fixed_graphs), be)
            out = artifact.write(be, graphs, tmp_path_factory.mktemp("built") / backend)
            cache[backend] = (out, graphs)
        return cache[backend]

    return get


@pytest.fixture
def fresh(built, tmp_path):
    """backend -> a copy of its artifact to break, and the graphs."""

    def get(backend: str):
        src, graphs = built(backend)
        return copy_of(src, tmp_path / backend), graphs

    return get
