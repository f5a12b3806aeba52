"""Backend names as a user writes them, `NAME` or `NAME:FLAVOUR`, parsed in one place.

    spec = parse_backend("onnx:ort")          # BackendSpec(name="onnx", flavour="ort")
    backends.get(spec.name, **spec.options())
    spec.variant()                            # what its artifact is built for: "ort"

Only onnx has flavours (its custom ops as ONNX functions, `portable`, or on onnxruntime's own
kernels, `ort`); a flavour of any other backend, an unknown flavour or a `--flavour` that
contradicts the one in the name is a UsageError. `diff`, `bench`, `compile` and `generate`
all read their backend names here, and the default variant of an artifact (onnx: portable,
tvm: llvm) is decided here for the command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError

DEFAULT_VARIANT = {"onnx": "portable", "tvm": "llvm"}


def flavours_of(name: str) -> tuple[str, ...]:
    """The flavours backend `name` takes (only onnx has any), without importing the backend."""
    from .backends import FLAVOURS

    return FLAVOURS.get(name, ())


@dataclass(frozen=True)
class BackendSpec:
    name: str
    flavour: str | None = None  # onnx only; None: the backend's default

    def __str__(self) -> str:
        """`onnx` for the portable flavour, `onnx:ort`: the label of reports and artifact folders."""
        return self.name if self.flavour in (None, DEFAULT_VARIANT.get(self.name)) else f"{self.name}:{self.flavour}"

    def options(self) -> dict:
        """Keyword arguments of `backends.get` for this spec."""
        return {"flavour": self.flavour} if self.flavour else {}

    def variant(self, target: str | None = None) -> str | None:
        """What the artifact is built for: the onnx flavour, the tvm target (default llvm)."""
        if self.flavour:
            return self.flavour
        if self.name == "tvm" and target:
            return target
        return DEFAULT_VARIANT.get(self.name)


def known_backends() -> tuple[str, ...]:
    from .backends import NAMES, registered

    return tuple(NAMES) + tuple(registered())


def parse_backend(text: str, flag: str = "--backend", flavour: str | None = None) -> BackendSpec:
    """`NAME` or `NAME:FLAVOUR`; `flavour` (a --flavour given beside it) must agree with the name's."""
    name, colon, variant = str(text).strip().partition(":")
    known = known_backends()
    if name not in known:
        raise UsageError(f"{flag} {text!r}: unknown backend {name!r}; known: {', '.join(known)}")
    allowed = flavours_of(name)
    if colon and not allowed:
        raise UsageError(f"{flag} {text!r}: backend {name!r} has no flavours (only onnx: "
                         f"{', '.join('onnx:' + f for f in flavours_of('onnx'))})")
    if colon and variant not in allowed:
        raise UsageError(f"{flag} {text!r}: unknown {name} flavour {variant!r}; known: {', '.join(allowed)}")
    if flavour is not None:
        if not allowed:
            raise UsageError(f"--flavour {flavour}: backend {name!r} has no flavours (only onnx)")
        if flavour not in allowed:
            raise UsageError(f"--flavour {flavour!r}: unknown {name} flavour; known: {', '.join(allowed)}")
        if colon and variant != flavour:
            raise UsageError(f"{flag} {text} and --flavour {flavour} contradict each other: give the flavour once")
        variant = flavour
    return BackendSpec(name, variant or None)


__all__ = ["BackendSpec", "parse_backend", "flavours_of", "known_backends", "DEFAULT_VARIANT"]
