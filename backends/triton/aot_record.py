"""Which Triton kernels a generated module launches: found by running it, not from a list.

The AOT worker (aot_worker.py) imports the generated module with TRITON_INTERPRET=0, so its
kernels are JITFunctions, and runs every entry on meta tensors (shapes and dtypes, no data,
no memory) with the launch intercepted: `JITFunction.run` binds the arguments exactly as a
launch would (triton's own binder: dtypes, the divisibility-by-16 and equal-to-1
specialisations of integers and pointers, the constexprs) and records the kernel instead of
compiling and launching it; an autotuned kernel records every config its autotuner would
try (after its pruning). The kernels found this way are what the module would launch at
those shapes, whatever the planner, the passes or the templates do today.

    with Recorder(target).intercepting() as rec:
        rec.case = "prefill T=8192"
        module.forward("prefill", meta_inputs, meta_weights)
    rec.launches   # key -> Launch, one per distinct compiled kernel
"""

from __future__ import annotations

import contextlib
import linecache
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import sympy
import torch

from ...ir import Graph

# the worker set TRITON_INTERPRET=0 before k3c chose the mode: these are compiled-mode objects
from triton.backends.compiler import GPUTarget  # isort: skip
from triton.compiler import ASTSource, make_backend  # isort: skip
from triton.runtime.autotuner import Autotuner  # isort: skip
from triton.runtime.jit import JITFunction, create_function_from_signature  # isort: skip


@dataclass
class Launch:
    """One distinct kernel: a JITFunction with the signature, constexprs and options of a launch."""

    fn: JITFunction
    signature: dict[str, str]
    constexprs: dict[tuple, object]
    attrs: dict[tuple, object]
    options: object  # the backend's options (num_warps, num_stages, ...)
    key: str
    cases: list[str] = field(default_factory=list)  # "prefill T=8192", "decode P=8192"
    grid: list[int] = field(default_factory=list)  # the largest grid launched, per axis (x, y, z)
    callers: list[str] = field(default_factory=list)  # the generated module's calls that launched it
    launches: int = 0

    @property
    def name(self) -> str:
        return self.fn.__name__

    def named_constexprs(self) -> dict[str, object]:
        """Constexprs by parameter name, dtype-valued ones as their name (JSON-friendly)."""
        names = self.fn.arg_names
        out = {}
        for path, value in sorted(self.constexprs.items()):
            if len(path) != 1:
                continue
            out[names[path[0]]] = value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
        return out

    def source(self) -> ASTSource:
        return ASTSource(self.fn, self.signature, self.constexprs, self.attrs)


class Recorder:
    """Records the kernels launched while `intercepting()` is active (see the module docstring)."""

    def __init__(self, target: GPUTarget):
        self.target = target
        self.backend = make_backend(target)
        self.launches: dict[str, Launch] = {}
        self.case = ""
        self._binders: dict[int, object] = {}
        self.module_file: str | None = None  # the generated module's file: launches are traced to its lines

    def record(self, fn: JITFunction, args: tuple, kwargs: dict, grid=None) -> None:
        from triton import knobs

        kwargs = dict(kwargs)
        # what JITFunction.run adds before it binds (debug and instrumentation are options)
        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        binder = self._binders.get(id(fn))
        if binder is None:
            binder = self._binders[id(fn)] = create_function_from_signature(fn.signature, fn.params, self.backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(self.backend, kwargs, bound, specialization, options)
        src = ASTSource(fn, signature, constexprs, attrs)
        key = f"{src.hash()}-{options.hash()}"
        launch = self.launches.get(key)
        if launch is None:
            launch = self.launches[key] = Launch(fn, signature, constexprs, attrs, options, key)
        launch.launches += 1
        launch.grid = _largest(launch.grid, grid(bound) if callable(grid) else grid)
        if self.case and self.case not in launch.cases:
            launch.cases.append(self.case)
        caller = _caller(self.module_file)
        if caller and caller not in launch.callers:
            launch.callers.append(caller)

    @contextlib.contextmanager
    def intercepting(self):
        """JITFunction.run records instead of launching; an Autotuner runs each pruned config
        once (as its `warmup` does) instead of benchmarking."""
        recorder = self
        saved = JITFunction.run, Autotuner.run

        def jit_run(fn, *args, grid=None, warmup=False, **kwargs):
            recorder.record(fn, args, kwargs, grid)
            return None

        def autotuner_run(tuner, *args, **kwargs):
            tuner.nargs = dict(zip(tuner.arg_names, args))
            try:
                for config in tuner.prune_configs(kwargs):
                    tuner.fn.run(*args, **kwargs, **config.all_kwargs())
            finally:
                tuner.nargs = None

        JITFunction.run, Autotuner.run = jit_run, autotuner_run
        try:
            yield self
        finally:
            JITFunction.run, Autotuner.run = saved


def _largest(seen: list[int], grid) -> list[int]:
    """The largest blocks per axis of the grids seen so far and `grid` (a launch's 1 to 3 ints;
    None when unknown), as [x, y, z]: what CUDA's launch limits are checked against."""
    if grid is None:
        return seen
    dims = [int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,))] + [1, 1]
    return [max(a, b) for a, b in zip(seen or [0, 0, 0], dims[:3])]


def _caller(module_file: str | None) -> str:
    """The call of the generated module's statement that launched the kernel: the template
    (`chunk_prepare`, `gated_mlp`, ...: named as the IR op it lowers, or a fused pattern such as
    `gated_rmsnorm`), `delta_recurrent` for a recurrent delta-family op, `rt.elementwise` for a
    generated kernel."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename != module_file:
        frame = frame.f_back
    if frame is None:
        return ""
    m = re.search(r"=\s*([\w.]+)\(", linecache.getline(module_file, frame.f_lineno))
    return m.group(1) if m else ""


def record_artifact(out_dir: Path, target: GPUTarget, *, seq_len: int, batch: int = 1) -> list[Launch]:
    """The kernels the Triton artifact in `out_dir` launches: each entry run once on meta
    tensors, B = batch, T = seq_len (a prefill), P = seq_len (the cache a decode step reads
    after such a prefill); the decode entry has T = 1 by its input's shape."""
    import json

    from ...ir import parse
    from .backend import _import

    manifest = json.loads((out_dir / "manifest.json").read_text())
    graphs = {e: parse((out_dir / spec["graph"]).read_text()) for e, spec in manifest["entries"].items()}
    module = _import(out_dir / manifest["module"])
    weights = meta_weights(graphs)
    sizes = {"B": batch, "T": seq_len, "P": seq_len}
    rec = Recorder(target)
    rec.module_file = module.__file__
    with rec.intercepting(), torch.no_grad():
        for entry, g in graphs.items():
            dims = {d: v for d, v in sizes.items() if d in g.dims}
            rec.case = f"{entry} " + " ".join(f"{d}={v}" for d, v in dims.items())
            inputs = meta_inputs(g, dims)
            try:
                module.forward(entry, inputs, weights)
            except Exception as e:
                raise RuntimeError(f"entry {rec.case}: the module does not run on meta tensors: "
                                   f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                                   f"(at {_module_line(e, out_dir / manifest['module'])})") from e
    return list(rec.launches.values())


def _module_line(e: BaseException, module: Path) -> str:
    """The generated module's statement that raised `e` (its line), or the innermost frame."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == module.resolve()]
    f = (mine or frames)[-1]
    return f"{Path(f.filename).name}:{f.lineno}: {(f.line or '').strip()[:160]}"


def meta_inputs(graph: Graph, dims: dict[str, int]) -> list[torch.Tensor]:
    """Meta tensors for the inputs of `graph` with its symbolic dims bound to `dims`."""
    missing = sorted(d for d in graph.dims if d not in dims)
    if missing:
        raise ValueError(f"{graph.name}: no size for dim(s) {missing} (sizes given: {dims})")
    subs = {sympy.Symbol(n, integer=True, positive=True): v for n, v in dims.items()}
    out = []
    for name in graph.inputs:
        t = graph.types[name]
        shape = [d if isinstance(d, int) else int(sympy.sympify(d).subs(subs)) for d in t.shape]
        out.append(torch.empty(shape, dtype=t.torch_dtype, device="meta"))
    return out


def meta_weights(graphs: dict[str, Graph]) -> dict[str, torch.Tensor]:
    """Every weight of every entry as a meta tensor of its type."""
    out: dict[str, torch.Tensor] = {}
    for g in graphs.values():
        for name in g.weights:
            t = g.types[name]
            out[name] = torch.empty([int(d) for d in t.shape], dtype=t.torch_dtype, device="meta")
    return out


__all__ = ["Launch", "Recorder", "record_artifact", "meta_inputs", "meta_weights", "GPUTarget"]
