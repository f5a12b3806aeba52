"""The CLI's argument values, checked before any work: a bad --json, --plot, --dot or --out
path, an empty backend list or a negative count fails in the first second with one line,
not after the whole run (or, worse, by doing nothing and exiting 0)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .errors import UsageError


def count(minimum: int):
    """An argparse type: an int >= minimum."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {n}")
        return n
    parse.__name__ = f"integer >= {minimum}"
    return parse


def output_file(flag: str, path: str | None) -> None:
    """A file the run will write at its end: it must be writable now."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a folder, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there (no permission)")


def plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'k3c[plot]'") from None


def flavours(text: str | None) -> list[str]:
    """--flavour portable,ort -> the ONNX flavours to run (default: every one)."""
    from .backends.onnx.lower import FLAVOURS

    if text is None:
        return list(FLAVOURS)
    names = [f.strip() for f in text.split(",") if f.strip()]
    if not names:
        raise UsageError(f"--flavour {text!r} names no flavour; known: {', '.join(FLAVOURS)}")
    bad = [f for f in names if f not in FLAVOURS]
    if bad:
        raise UsageError(f"unknown ONNX flavour(s) {bad}; known: {', '.join(FLAVOURS)}")
    return names


def backend_specs(text: str, flavour_list: list[str], flag: str = "--backends") -> list[str]:
    """`reference,onnx,tvm` or `all` -> the backends to run, onnx once per flavour
    (`onnx` is the portable flavour, `onnx:ort` the ort one); an empty list is an error."""
    from .backends import NAMES, registered

    names = list(NAMES) if text.strip() == "all" else [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise UsageError(f"{flag} {text!r} names no backend; known: {', '.join(NAMES)} or all")
    unknown = [b for b in names if b.partition(":")[0] not in NAMES + registered()]
    if unknown:
        raise UsageError(f"unknown backend(s) {unknown}; known: {', '.join(NAMES)} or all")
    specs: list[str] = []
    for b in names:
        name, _, variant = b.partition(":")
        if variant:
            if name != "onnx" or variant not in flavours(variant):
                raise UsageError(f"backend {b!r}: only onnx takes a flavour (onnx:portable, onnx:ort)")
            expanded = [b if variant != "portable" else "onnx"]
        elif name == "onnx":
            expanded = ["onnx" if f == "portable" else f"onnx:{f}" for f in flavour_list]
        else:
            expanded = [name]
        specs += [s for s in expanded if s not in specs]
    return specs


def out_root(path: str | None, specs: list[str], model: str, force: bool) -> None:
    """--out of diff/bench: a folder that gets one artifact per backend (DIR/onnx, DIR/onnx-ort ...)."""
    if path is None:
        return
    from .backends import artifact

    root = Path(path)
    if root.exists() and not root.is_dir():
        raise UsageError(f"--out {path}: is a file; artifacts go into a folder")
    for spec in specs:
        name, _, variant = spec.partition(":")
        variant = variant or ("portable" if name == "onnx" else "llvm" if name == "tvm" else None)
        artifact.check_target(root / spec.replace(":", "-"), backend=name, model=model, variant=variant, force=force)


def write_json(path: str, data: dict) -> None:
    import json

    try:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
    except OSError as err:
        raise UsageError(f"--json {path}: cannot write ({err.strerror})") from None
