"""Shared test setup: GPU-only tests (marked `gpu`) are skipped where CUDA is unavailable,
and `zoo(name)` gives a tiny model with its captured prefill and decode graphs, captured
once per test session (a capture takes seconds)."""

from __future__ import annotations

import os

import pytest
import torch
from factories import CAPTURE_T, example_ids

import k3c

# Without CUDA the Triton kernels run under triton's interpreter, which must be chosen before
# triton is first imported (some tests import fla, which imports triton).
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# Under pytest-xdist (`-n 2`) each worker takes one core: torch, TVM's and onnxruntime's pools
# would otherwise each start a thread per core in every worker and contend for the same cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def tvm_build_cache(tmp_path_factory):
    """One TVM build per distinct graph structure for the whole session (backends/tvm/cache.py):
    tests that compile the same model with other weights (stresses, re-seeds) reuse lib.so,
    across xdist workers too."""
    before = os.environ.get("K3C_CACHE_DIR")
    base = tmp_path_factory.getbasetemp()
    # xdist workers share one cache (a store is an atomic rename, so two writers are safe)
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "k3c-cache"
    root.mkdir(exist_ok=True)
    os.environ["K3C_CACHE_DIR"] = str(root)
    yield
    if before is None:
        os.environ.pop("K3C_CACHE_DIR", None)
    else:
        os.environ["K3C_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def zoo():
    """name -> (model, prefill graph, decode graph), captured at B = 2, T = 16 on first use."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            model = k3c.models.build(name)
            ids = example_ids(model, 2, CAPTURE_T)
            cache[name] = (model, k3c.capture(model, (ids,)), k3c.capture(model, (ids,), entry="decode"))
        return cache[name]

    return get


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
