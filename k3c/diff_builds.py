"""k3c diff's builds: each backend's artifact built in a thread beside the checks.

The pipeline as the backend runs it (passes, legalize), written and loaded, one backend after
another in one thread: the thread that checks them takes each as soon as it is built. Those
whose build is mostly native code (TVM's LLVM: backends.native_build) go last, so that it
overlaps with the checks of the others; interpreted ones first (their runs are the longest,
and go to a worker process, k3c/diff_runs.py, which loads them itself). The pipeline runs once
per distinct set of steps (prepare's memo): until legalize the graphs of most backends are the
same.
"""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import backends as backends_mod
from .backends import artifact
from .compiler import prepare
from .errors import UsageError


def backend_for(spec: str, compute: str | None = None):
    """A backend object from a name as `diff` takes it: NAME or NAME:FLAVOUR (onnx:ort),
    computing in `compute` ("f32") when given."""
    from .backend_spec import parse_backend

    parsed = parse_backend(spec, "backend")
    be = backends_mod.get(parsed.name, **parsed.options())
    if compute is None or getattr(be, "compute_dtype", None) == compute:
        return be
    try:
        return backends_mod.get(parsed.name, compute=compute, **parsed.options())
    except TypeError:
        raise UsageError(f"backend {spec!r} cannot compute in {compute}") from None


def simulated(spec: str) -> bool:
    """Whether the backend's speed says nothing: Triton under its interpreter."""
    from .kernels.common import triton_mode

    return spec.split(":")[0] == "triton" and triton_mode.interpreted()


@dataclass
class Built:
    spec: str
    out_dir: Path
    be: object = None
    graphs: dict | None = None
    runner: object = None
    seconds: float = 0.0
    error: BaseException | None = None


class Builds:
    """Each backend's artifact (the pipeline as it runs it, legalized, written and loaded),
    built one after another in one thread, interpreted ones first (the worker runs them),
    those whose build is mostly native code (TVM's LLVM: backends.native_build) last, so that
    it overlaps with the checks of the others. The pipeline runs once per distinct set of
    steps (prepare's memo): until legalize the graphs of most backends are the same."""

    def __init__(self, specs: list[str], captured: dict, passes, root: Path, force: bool,
                 compute: str | None, state_dtype: str | None, built):
        self._args = (captured, passes, force, compute, state_dtype)
        self._built_hook = built  # called with each (spec, Built) once written: True if it runs elsewhere
        self._done = {spec: threading.Event() for spec in specs}
        self._built = {spec: Built(spec, root / spec.replace(":", "-")) for spec in specs}
        self._finished: queue.Queue[str] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="k3c-diff-builds", daemon=True)
        self._thread.start()

    def _write(self, spec: str, memo: dict) -> float:
        """Prepare and write `spec`'s artifact: the seconds of the write."""
        captured, passes, force, compute, state_dtype = self._args
        b = self._built[spec]
        b.be = backend_for(spec)
        b.graphs = prepare(captured, b.be, passes, None, compute, state_dtype, memo=memo)
        if compute == "bf16":
            from .precision_check import with_routing_outputs

            with_routing_outputs(b.graphs)
        t0 = time.perf_counter()
        artifact.write(b.be, b.graphs, b.out_dir, force=force)
        return time.perf_counter() - t0

    def _run(self) -> None:
        memo: dict = {}
        for spec in self._order():
            b = self._built[spec]
            if self._stop.is_set():
                b.error = RuntimeError("not built: the diff stopped")
            else:
                try:
                    b.seconds = self._write(spec, memo)
                    t0 = time.perf_counter()
                    if not self._built_hook(spec, b):  # run here: loaded here (the worker loads its own)
                        b.runner = b.be.load(b.out_dir)
                        b.seconds += time.perf_counter() - t0
                except BaseException as e:  # handed to the thread that checks this backend
                    b.error = e
            self._done[spec].set()
            self._finished.put(spec)

    def _order(self) -> list[str]:
        """Interpreted ones first (their runs are the longest, in the worker), native builds
        last (they overlap the checks of the others), else as given."""
        specs = list(self._built)
        try:
            first = [s for s in specs if simulated(s)]
        except Exception:  # never a thread that ends before every backend is handed over
            first = []
        rest = [s for s in specs if s not in first]
        return first + sorted(rest, key=backends_mod.native_build)

    def import_native(self) -> None:
        """Import the backends built last (native builds: TVM's import takes 2 s), for a thread
        other than the build thread to call while that one builds the others."""
        for spec in self._built:
            if backends_mod.native_build(spec):
                try:
                    backend_for(spec)
                except Exception:  # its build raises it, in its place
                    pass

    def finished(self) -> Iterator[str]:
        """Every backend's name, each as soon as its build has finished (or failed)."""
        for _ in self._built:
            yield self._finished.get()

    def result(self, spec: str) -> Built:
        self._done[spec].wait()
        return self._built[spec]

    def join(self, wait: bool = True) -> None:
        """Stop building; with `wait` False, return at once and remove the half-built folder of
        a build in progress (artifact.write's `.NAME.new-*`), which the process's exit ends."""
        self._stop.set()
        if wait:
            self._thread.join()
            return
        for spec, b in self._built.items():
            if not self._done[spec].is_set():
                for partial in b.out_dir.parent.glob(f".{b.out_dir.name}.new-*"):
                    shutil.rmtree(partial, ignore_errors=True)
