"""An artifact folder as a whole: what it holds, its checksums, and how it gets into place.

Every backend writes `DIR/manifest.json`; `seal` adds to it what the folder is (backend,
model, flavour or target) and the size and SHA-256 of every other file, and `verify` checks
them when the artifact is loaded, so a truncated `lib.so` or weight file is an ArtifactError
naming the file instead of a crash in the runtime that maps it.

`write` lowers into a fresh folder beside the target and moves it into place only when it
is complete, so a failure part-way leaves the old artifact whole; it refuses to replace a
folder that holds anything other than an artifact of the same model for the same backend,
unless `force`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ArtifactError, UsageError

MANIFEST = "manifest.json"


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(out_dir: Path) -> list[Path]:
    return sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != MANIFEST and "__pycache__" not in p.parts)


def read(out_dir: str | Path) -> dict | None:
    """The manifest of `out_dir`, or None when it has none (or one that is not JSON)."""
    path = Path(out_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def seal(out_dir: str | Path, *, backend: str, model: str | None, variant: str | None = None) -> None:
    """Record in DIR/manifest.json what the artifact is and the checksum of each of its files."""
    out_dir = Path(out_dir)
    manifest = read(out_dir)
    if manifest is None:
        raise ArtifactError(f"{out_dir}: the {backend} backend wrote no readable {MANIFEST}")
    manifest["artifact"] = {"backend": backend, "model": model, "variant": variant}
    manifest["files"] = {str(p.relative_to(out_dir)): {"bytes": p.stat().st_size, "sha256": _digest(p)}
                         for p in _files(out_dir)}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def verify(out_dir: str | Path, backend: str) -> dict:
    """Check that `out_dir` is a complete, undamaged artifact of `backend`; returns its manifest."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ArtifactError(f"{out_dir} is not a folder (no {backend} artifact there)")
    manifest = read(out_dir)
    if manifest is None:
        raise ArtifactError(f"{out_dir} holds no k3c artifact: {MANIFEST} is missing or unreadable")
    what = manifest.get("artifact", {}).get("backend")
    if what != backend:
        raise ArtifactError(f"{out_dir} holds a {what or 'non-k3c'} artifact, not a {backend} one")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ArtifactError(f"{out_dir}/{MANIFEST} lists no checksums; compile the artifact again")
    for name, want in files.items():
        path = out_dir / name
        if not path.is_file():
            raise ArtifactError(f"{out_dir}: {name} is missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise ArtifactError(f"{out_dir}: {name} has {size} bytes, the manifest says {want['bytes']} "
                                f"(truncated or replaced)")
        if _digest(path) != want["sha256"]:
            raise ArtifactError(f"{out_dir}: {name} fails its SHA-256 checksum (damaged or replaced)")
    return manifest


def describe(out_dir: Path) -> str | None:
    """None when `out_dir` may be written without asking (absent or empty), else what it holds."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        return "a file"
    if not any(out_dir.iterdir()):
        return None
    art = (read(out_dir) or {}).get("artifact")
    if not isinstance(art, dict):
        return "files that are not a k3c artifact"
    variant = f" ({art['variant']})" if art.get("variant") else ""
    return f"a {art.get('backend')}{variant} artifact of {art.get('model')}"


def check_target(out_dir: str | Path, *, backend: str, model: str | None, variant: str | None = None,
                 force: bool = False) -> None:
    """Refuse (UsageError) a target folder whose contents `write` must not replace."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} is a file; an artifact is a folder")
    parent = out_dir.resolve().parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write into {parent} (no permission)")
    held = describe(out_dir)
    if held is None or force:
        return
    art = (read(out_dir) or {}).get("artifact") or {}
    same_variant = art.get("variant") == variant or None in (art.get("variant"), variant)
    if (art.get("backend"), art.get("model")) == (backend, model) and same_variant:
        return  # compiling the same thing again replaces it
    raise UsageError(f"{out_dir} holds {held}; choose another folder or pass --force (force=True) to replace it")


def write(backend, graphs: dict, out_dir: str | Path, *, force: bool = False) -> Path:
    """Lower `graphs` with `backend` into `out_dir`, atomically: the new artifact is built in a
    fresh folder beside it and moved into place when complete."""
    out_dir = Path(out_dir)
    first = next(iter(graphs.values()))
    check_target(out_dir, backend=backend.name, model=first.meta.get("model"), variant=variant_of(backend),
                 force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        backend.lower(graphs, tmp)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            old.rmdir()
            out_dir.rename(old)
            try:
                tmp.rename(out_dir)
            except OSError:
                old.rename(out_dir)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def variant_of(backend) -> str | None:
    """The flavour (onnx) or target (tvm) an artifact is built for: part of what it is."""
    for key in ("flavour", "target"):
        value = getattr(backend, key, None)
        if value:
            return str(value)
    return None
