"""An artifact folder as a whole: what it holds, its checksums, and how it gets into place.

Every backend writes `DIR/manifest.json`; `seal` adds to it what the folder is (backend,
model, flavour or target) and the size and SHA-256 of every other file, and `verify` checks
them when the artifact is loaded, so a truncated `lib.so` or weight file is an ArtifactError
naming the file instead of a crash in the runtime that maps it. The manifest guards the whole
folder, not only what it lists: a file in the folder it does not list, a listed name that
leaves the folder (`../x`), a link out of it or a special file (a FIFO would block the
checksum) is refused, and so is a manifest that is not the shape `seal` writes
(backends/manifest.py names the field).

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
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..errors import ArtifactError, UsageError
from .manifest import Fields

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20  # k3c's largest manifests are a few hundred KiB
SKIPPED = "__pycache__"  # Python's cache of an imported Triton module, written after the seal


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(out_dir: Path) -> list[Path]:
    return sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != MANIFEST and "__pycache__" not in p.parts)


def read(out_dir: str | Path) -> dict | None:
    """The manifest of `out_dir`, or None when it has none (or one that is not a JSON object)."""
    path = Path(out_dir) / MANIFEST
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
            return None  # a link, a FIFO (reading it would block) or something no k3c wrote
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def seal(out_dir: str | Path, *, backend: str, model: str | None, variant: str | None = None,
         graphs: dict | None = None) -> None:
    """Record in DIR/manifest.json what the artifact is and the checksum of each of its files;
    with `graphs`, also what each entry's integer inputs index (contract.limits), which a
    runner without the graphs checks its inputs against."""
    from .contract import limits

    out_dir = Path(out_dir)
    manifest = read(out_dir)
    if manifest is None:
        raise ArtifactError(f"{out_dir}: the {backend} backend wrote no readable {MANIFEST}")
    manifest["artifact"] = {"backend": backend, "model": model, "variant": variant}
    if graphs is not None:
        manifest["limits"] = {entry: limits(g) for entry, g in graphs.items()}
    manifest["files"] = {str(p.relative_to(out_dir)): {"bytes": p.stat().st_size, "sha256": _digest(p)}
                         for p in _files(out_dir)}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def verify(out_dir: str | Path, backend: str, uses: Iterable[str] = ()) -> dict:
    """Check that `out_dir` is a complete, undamaged artifact of `backend`; returns its manifest.
    `uses`: the files the loader opens, each of which the manifest must list."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ArtifactError(f"{out_dir} is not a folder (no {backend} artifact there)")
    manifest = read(out_dir)
    if manifest is None:
        raise ArtifactError(f"{out_dir} holds no k3c artifact: {MANIFEST} is missing, unreadable or not an object")
    f = Fields(out_dir / MANIFEST)
    art = f.obj(manifest.get("artifact"), "artifact", keys=("backend",))
    what = f.text(art["backend"], "artifact.backend")
    if what != backend:
        raise ArtifactError(f"{out_dir} holds a {what[:40]} artifact, not a {backend} one")
    if "files" not in manifest:
        raise ArtifactError(f"{out_dir}/{MANIFEST} lists no checksums; compile the artifact again")
    files = {f.file(name, "files key"): f.obj(want, f"files.{name}", keys=("bytes", "sha256"))
             for name, want in f.obj(manifest["files"], "files").items()}
    if not files:
        f.fail("files", "lists no file: an artifact's manifest checks every file it holds")
    for name, want in files.items():
        f.integer(want["bytes"], f"files.{name}.bytes")
        f.digest(want["sha256"], f"files.{name}.sha256")
    unlisted = sorted(set(_held(out_dir)) - set(files))
    if unlisted:
        raise ArtifactError(f"{out_dir}: {unlisted[0]!r} is not listed in {MANIFEST}"
                            f"{f' (and {len(unlisted) - 1} more)' if len(unlisted) > 1 else ''}; "
                            f"every file of an artifact is listed and checked")
    for name in uses:
        if name not in files:
            raise ArtifactError(f"{out_dir}: the manifest does not list {name!r}, which the {backend} loader reads")
    root = out_dir.resolve()
    for name, want in files.items():
        path = out_dir / name
        if not _inside(path, root):
            raise ArtifactError(f"{out_dir}: {name} leads outside the artifact (through a link)")
        if not path.is_file():
            raise ArtifactError(f"{out_dir}: {name} is missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise ArtifactError(f"{out_dir}: {name} has {size} bytes, the manifest says {want['bytes']} "
                                f"(truncated or replaced)")
        try:
            digest = _digest(path)
        except OSError as err:
            raise ArtifactError(f"{out_dir}: cannot read {name} ({err.strerror})") from None
        if digest != want["sha256"]:
            raise ArtifactError(f"{out_dir}: {name} fails its SHA-256 checksum (damaged or replaced)")
    return manifest


def _inside(path: Path, root: Path) -> bool:
    """`path` resolves to a place inside `root` (False for a loop of links)."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def _held(out_dir: Path) -> list[str]:
    """The files of `out_dir` (relative posix names) but the manifest and Python's caches; a link
    that leaves the folder or anything but a file, a folder or a link is an ArtifactError."""
    root = out_dir.resolve()
    out = []
    for top, dirs, names in os.walk(out_dir, followlinks=False):
        dirs[:] = [d for d in dirs if d != SKIPPED]
        for name in dirs + names:
            path = Path(top) / name
            rel = path.relative_to(out_dir).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                if not _inside(path, root):
                    raise ArtifactError(f"{out_dir}: {rel} is a link that leads outside the artifact (or in a loop)")
                try:
                    mode = path.stat().st_mode
                except OSError:
                    raise ArtifactError(f"{out_dir}: {rel} is a link to nothing") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ArtifactError(f"{out_dir}: {rel} is not a regular file")
            if stat.S_ISREG(mode) and rel != MANIFEST:
                out.append(rel)
    return out


def listed(out_dir: str | Path, manifest: dict, name: str, field: str) -> Path:
    """`out_dir / name` for a file the manifest's `field` names: a plain path inside the folder
    that the manifest lists (so `verify` has checked it)."""
    f = Fields(Path(out_dir) / MANIFEST)
    name = f.file(name, field)
    if name not in manifest["files"]:
        f.fail(field, f"names {name!r}, which the manifest's files do not list")
    return Path(out_dir) / name


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
    variant = f" ({str(art['variant'])[:40]})" if art.get("variant") else ""
    return f"a {str(art.get('backend'))[:40]}{variant} artifact of {str(art.get('model'))[:80]}"


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
    art = (read(out_dir) or {}).get("artifact")
    art = art if isinstance(art, dict) else {}
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
