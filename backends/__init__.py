"""k3c.backends: reference (the interpreter), onnx, tvm, triton.

`get(name)` returns a backend object (see base.py for what one is); heavy toolchains are
imported only when their backend is asked for.
"""

from __future__ import annotations

import importlib

from ..kernels.common import triton_mode
from .base import Backend, Runner, UnsupportedNodeError, check_supported

try:  # before torch.export imports triton while capturing: see kernels/common/triton_mode.py
    triton_mode.choose()
except ImportError:  # triton was imported first; the Triton backend says so if it is used
    pass

# name -> "module:attribute" of the backend object's class
_REGISTRY = {
    "reference": "k3c.backends.reference:ReferenceBackend",
    "onnx": "k3c.backends.onnx:OnnxBackend",
    "tvm": "k3c.backends.tvm:TvmBackend",
    "triton": "k3c.backends.triton:TritonBackend",
}
NAMES = tuple(_REGISTRY)


_EXTRA: dict[str, type] = {}


def register(name: str, cls: type) -> None:
    """Make `get(name)` return `cls(**options)`: for out-of-tree backends (and tests)."""
    _EXTRA[name] = cls


def registered() -> tuple[str, ...]:
    """The names `register` added."""
    return tuple(_EXTRA)


def get(name: str, **options) -> Backend:
    if name in _EXTRA:
        return _EXTRA[name](**options)
    if name not in _REGISTRY:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(list(_REGISTRY) + list(_EXTRA))}")
    module, attr = _REGISTRY[name].split(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise KeyError(f"backend {name!r} is not available here: {e}") from e
    return cls(**options)


__all__ = ["get", "register", "registered", "NAMES", "Backend", "Runner", "UnsupportedNodeError", "check_supported"]
