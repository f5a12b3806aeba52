"""Fixtures of the serving tests: graphs captured with fixed caches, once a session."""

from __future__ import annotations

import pytest
import torch
from serving_testlib import CAPACITY

import k3c


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
