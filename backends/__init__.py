"""k3c.backends: reference (the interpreter), onnx, tvm, triton.

`get(name)` returns a backend object (see base.py for what one is); heavy toolchains are
imported only when their backend is asked for.
"""

from __future__ import annotations

if __name__ != "k3c.backends":  # imported under its bare name, e.g. from the repository root: kernels/bare_name.py
    import os as _os
    import runpy as _runpy  # by path: under a bare name there is no package to import the guard from

    _runpy.run_path(_os.path.join(_os.path.dirname(_os.path.dirname(__file__)), "kernels", "bare_name.py"))[
        "guard"](globals())  # a probe gets a stand-in that holds nothing; an import statement, the error


import importlib
import inspect

from ..kernels.common import triton_mode
from .base import Backend, Runner, UnsupportedNodeError, check_supported
from .tables import Lowering, lowering

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
# whose lower() is mostly native code (TVM: LLVM), outside the GIL: k3c diff builds them last
_NATIVE_BUILDS = frozenset({"tvm"})
# the flavours a backend takes (NAME:FLAVOUR), the first its default; known without importing it
FLAVOURS = {"onnx": ("portable", "ort")}


_EXTRA: dict[str, type] = {}


def register(name: str, cls: type) -> None:
    """Make `get(name)` return `cls(**options)`: for out-of-tree backends (and tests)."""
    _EXTRA[name] = cls


def registered() -> tuple[str, ...]:
    """The names `register` added."""
    return tuple(_EXTRA)


def native_build(name: str) -> bool:
    """Whether backend `name` (NAME or NAME:FLAVOUR) builds mostly in native code, known without
    importing it; a registered class says so by a true `native_build` attribute."""
    name = name.split(":")[0]
    if name in _EXTRA:
        return bool(getattr(_EXTRA[name], "native_build", False))
    return name in _NATIVE_BUILDS


def get(name: str, **options) -> Backend:
    """The backend `name`, configured by `options` (onnx: flavour, providers, threads,
    spinning, target; tvm: target, arch); an option it does not take is a TypeError naming it."""
    if name in _EXTRA:
        cls = _EXTRA[name]
    elif name not in _REGISTRY:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(list(_REGISTRY) + list(_EXTRA))}")
    else:
        module, attr = _REGISTRY[name].split(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise KeyError(f"backend {name!r} is not available here: {e}") from e
    known = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    unknown = sorted(set(options) - set(known))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values()):
        raise TypeError(f"{name} backend: unknown option(s) {unknown}; known: {', '.join(known) or 'none'}")
    return cls(**options)


__all__ = ["get", "register", "registered", "native_build", "FLAVOURS", "NAMES", "Backend", "Runner",
           "UnsupportedNodeError", "check_supported", "lowering", "Lowering"]
