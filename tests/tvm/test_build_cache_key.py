"""The TVM build cache's key covers every source the lowering imports (a stale lib.so is a
silent wrong answer): the files a glob of `kernels/*/tvm/*.py` missed are in it, and an edit
to any of them changes the key."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from k3c.backends.tvm import cache

# Read by the TVM lowering from outside any `tvm/` folder: the cached-attention kernels and
# the MXFP4 tables.
OUTSIDE_TVM_FOLDERS = ["kernels/cache/tvm.py", "kernels/cache/tvm_blocked.py", "kernels/mxfp4/naive.py"]


def _root() -> Path:
    return Path(importlib.import_module("k3c.backends").__file__).resolve().parents[1]


@pytest.mark.parametrize("rel", OUTSIDE_TVM_FOLDERS)
def test_key_reads_every_imported_source(rel):
    assert (_root() / rel).resolve() in set(cache.lowering_sources())


def test_key_changes_with_an_imported_kernel(monkeypatch):
    """The digest of the same files with one byte of kernels/cache/tvm.py changed differs."""
    target = (_root() / "kernels/cache/tvm.py").resolve()
    real = Path.read_bytes

    def edited(self: Path) -> bytes:
        data = real(self)
        return data + b"\n# edited\n" if self.resolve() == target else data

    before = cache._source_digest.__wrapped__()
    monkeypatch.setattr(Path, "read_bytes", edited)
    assert cache._source_digest.__wrapped__() != before
