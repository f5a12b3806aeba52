"""A cache of compiled TVM libraries, keyed by what the build reads: the graphs' text (names,
types, attributes, not weight values), the target, the options, the versions of k3c and TVM,
and the source of the code that lowers (this package and every k3c module it imports,
transitively: the TVM kernels wherever they live and what they read), so an edited lowering
never meets a library built by the old one.

The weights of a TVM artifact are parameters of its functions, never constants (lower.py), so
two graphs that differ only in weight values (a re-seeded model, a k3c diff --stress) build the
same lib.so. With K3C_CACHE_DIR set, a build whose key is cached copies that library instead
of compiling for tens of seconds; without it nothing is cached.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from ...ir import Graph, print_graph

LIBS = ("lib.so", "kernels.cu")


def _dir() -> Path | None:
    root = os.environ.get("K3C_CACHE_DIR")
    return Path(root) / "tvm" if root else None


def _resolve(module: str) -> Path | None:
    """The source file of k3c module `module` (None: not a k3c module, or not a file)."""
    if not module.startswith("k3c."):
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _imports(path: Path, module: str) -> set[str]:
    """The k3c modules `path` (module `module`) imports, with each `from X import name` read
    both as module X and as submodule X.name (whichever exists)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module or ""
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("k3c.")}


def lowering_sources() -> list[Path]:
    """Every source file the TVM lowering imports, transitively, from backends/tvm on (the
    kernels it builds, wherever their folder, and what those read: the MXFP4 tables, ...)."""
    start = {f"{__package__}.{f.stem}" if f.name != "__init__.py" else __package__
             for f in Path(__file__).resolve().parent.glob("*.py")}
    seen: dict[str, Path] = {}
    todo = sorted(start)
    while todo:
        module = todo.pop()
        path = _resolve(module)
        if module in seen or path is None:
            continue
        seen[module] = path
        todo.extend(m for m in _imports(path, module) if m not in seen)
    return sorted(set(seen.values()))


@functools.cache
def _source_digest() -> str:
    """SHA-256 of the TVM lowering's own source and of everything it imports from k3c."""
    h = hashlib.sha256()
    for f in lowering_sources():
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def key(graphs: dict[str, Graph], target: str, options: dict) -> str:
    import tvm

    from ... import __version__

    h = hashlib.sha256()
    h.update(_source_digest().encode())
    from .target import make_target

    # llvm: the -mcpu and the features the OS turns off (a cache dir shared between hosts)
    compiled_for = str(make_target(target, options.get("arch"), options.get("mcpu")))
    h.update(json.dumps([target, compiled_for, sorted((k, str(v)) for k, v in options.items()), __version__,
                         tvm.__version__]).encode())
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
