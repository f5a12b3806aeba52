"""Fixtures of the TVM backend tests: the tiny zoo through the default pipeline, built for
`llvm` once per session (a build takes tens of seconds on two cores)."""

from __future__ import annotations

import pytest

import k3c
from k3c.backends.tvm import TvmBackend


@pytest.fixture(scope="session")
def tvm_zoo(zoo, tmp_path_factory):
    """tvm_zoo(name) -> (model, graphs after the default pipeline, artifact dir, runner)."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            model, prefill, decode = zoo(name)
            graphs = {"prefill": k3c.passes.run(prefill, "default"), "decode": k3c.passes.run(decode, "default")}
            out = tmp_path_factory.mktemp(f"tvm-{name}")
            be = TvmBackend(target="llvm")
            be.lower(graphs, out)
            cache[name] = (model, graphs, out, be.load(out))
        return cache[name]

    return get
