"""A cache of compiled TVM libraries, keyed by what the build reads: the graphs' text (names,
types, attributes, not weight values), the target, the options, the versions of k3c and TVM,
and the source of the code that lowers (this package and the TVM kernels), so an edited
lowering never meets a library built by the old one.

The weights of a TVM artifact are parameters of its functions, never constants (lower.py), so
two graphs that differ only in weight values (a re-seeded model, a k3c diff --stress) build the
same lib.so. With K3C_CACHE_DIR set, a build whose key is cached copies that library instead
of compiling for tens of seconds; without it nothing is cached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

from ...ir import Graph, print_graph

LIBS = ("lib.so", "kernels.cu")


def _dir() -> Path | None:
    root = os.environ.get("K3C_CACHE_DIR")
    return Path(root) / "tvm" if root else None


@functools.cache
def _source_digest() -> str:
    """SHA-256 of the TVM lowering's own source: backends/tvm and kernels/*/tvm."""
    here = Path(__file__).resolve().parent
    kernels = here.parents[1] / "kernels"
    files = sorted(here.glob("*.py")) + sorted(kernels.glob("*/tvm/*.py")) + sorted(kernels.glob("*/*/tvm/*.py"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def key(graphs: dict[str, Graph], target: str, options: dict) -> str:
    import tvm

    from ... import __version__

    h = hashlib.sha256()
    h.update(_source_digest().encode())
    h.update(json.dumps([target, sorted((k, str(v)) for k, v in options.items()), __version__, tvm.__version__])
             .encode())
    for entry, g in sorted(graphs.items()):
        h.update(entry.encode())
        h.update(print_graph(g).encode())
    return h.hexdigest()[:32]


def fetch(k: str, out_dir: Path) -> bool:
    """Copy the cached library of key `k` into `out_dir`; False when there is none."""
    root = _dir()
    if root is None or not (root / k / "lib.so").is_file():
        return False
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in LIBS:
        if (root / k / name).is_file():
            shutil.copyfile(root / k / name, out_dir / name)
    return True


def store(k: str, out_dir: Path) -> None:
    root = _dir()
    if root is None or (root / k / "lib.so").is_file():
        return
    tmp = root / f".{k}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for name in LIBS:
        if (out_dir / name).is_file():
            shutil.copyfile(out_dir / name, tmp / name)
    try:
        tmp.rename(root / k)
    except OSError:  # another process stored it first
        shutil.rmtree(tmp, ignore_errors=True)
