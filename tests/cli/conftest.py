"""Fixtures of the CLI tests."""

from __future__ import annotations

import pytest

import k3c


@pytest.fixture
def no_work(monkeypatch):
    """Building a model is the first piece of work: a check that passes it has come too late."""
    def refuse(*a, **k):
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(k3c.models, "build", refuse)
