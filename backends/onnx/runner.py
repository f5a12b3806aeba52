"""Running an ONNX artifact with onnxruntime: `OnnxRunner(out_dir).run("decode", ids, *state)`.

Inputs are checked against the manifest before onnxruntime sees them, so a wrong state
shape is an `InputError` naming the input and the shape it expects, not a runtime crash.
The CUDA provider is used when onnxruntime has it, else the CPU provider. Worker threads
do not spin between ops by default (`spinning=True` restores onnxruntime's default).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import sympy
import torch

from ...errors import InputError
from ..artifact import verify
from .artifact import read_manifest
from .inplace import aliases, run_bound


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def _fmt(spec: dict) -> str:
    return f"{spec['dtype']}[{', '.join(str(d) for d in spec['shape'])}]"


@functools.cache
def _dim_fn(text: str):
    """A dim expression of the manifest ("P + 1") as a function of the bound dims."""
    expr = sympy.sympify(text)
    names = sorted(str(x) for x in expr.free_symbols)
    fn = sympy.lambdify([sympy.Symbol(n) for n in names], expr, modules="math")
    return lambda env: int(fn(*(env[n] for n in names)))


def check_inputs(entry: str, specs: list[dict], arrays: list[np.ndarray], dims: dict) -> dict[str, int]:
    """Bind the symbolic dims from the inputs; an InputError names the first misfit."""
    if len(arrays) != len(specs):
        names = ", ".join(s["name"] for s in specs)
        raise InputError(f"{entry} takes {len(specs)} inputs ({names}), got {len(arrays)}")
    env: dict[str, int] = {}
    for spec, a in zip(specs, arrays):
        if a.dtype.name != spec["dtype"] or a.ndim != len(spec["shape"]):
            got = f"{a.dtype.name}{list(a.shape)}"
            raise InputError(f"{entry} input {spec['name']!r}: expected {_fmt(spec)}, got {got}")
        for d, n in zip(spec["shape"], a.shape):
            if isinstance(d, str) and d.isidentifier():
                env.setdefault(d, int(n))
    for spec, a in zip(specs, arrays):
        for axis, (d, n) in enumerate(zip(spec["shape"], a.shape)):
            want = d if isinstance(d, int) else env[d] if d in env else _dim_fn(d)(env)
            if int(n) != want:
                raise InputError(f"{entry} input {spec['name']!r}: expected {_fmt(spec)} with "
                                 f"{', '.join(f'{k}={v}' for k, v in env.items())}, got {list(a.shape)} "
                                 f"(dim {axis} is {n}, expected {want})")
    for spec, a in zip(specs, arrays):
        if "bounds" in spec and a.size:
            lo, hi = spec["bounds"]
            bad = a[(a < lo) | (a >= hi)]
            if bad.size:
                raise InputError(f"{entry} input {spec['name']!r}: id {int(bad.flat[0])} is outside [{lo}, {hi})")
    for name, (lo, hi) in dims.items():
        if name in env and (env[name] < lo or (hi is not None and env[name] > hi)):
            raise InputError(f"{entry}: dim {name} = {env[name]} is outside [{lo}, {hi if hi is not None else 'inf'}]")
    return env


class OnnxRunner:
    """Runs the entries of an artifact; inputs and outputs in the manifest's order."""

    def __init__(self, out_dir: str | Path, providers: list[str] | None = None, threads: int | None = None,
                 spinning: bool = False):
        self.out_dir = Path(out_dir)
        verify(self.out_dir, "onnx")  # every file present and undamaged before onnxruntime maps it
        self.manifest = read_manifest(self.out_dir)
        self.providers = providers or default_providers()
        self.threads, self.spinning = threads, spinning
        self._sessions: dict = {}
        self.entries: dict[str, dict] = self.manifest["entries"]  # file, inputs, outputs of each graph

    def session(self, entry: str):
        if entry not in self.manifest["entries"]:
            raise KeyError(f"{self.out_dir} has no entry {entry!r}; it has {', '.join(self.manifest['entries'])}")
        if entry not in self._sessions:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.log_severity_level = 3  # errors only
            if self.threads:
                opts.intra_op_num_threads = self.threads
            if not self.spinning:
                # idle worker threads sleep instead of spinning: on a CPU shared with other work
                # spinning made a k3-small decode step 2x slower; on an idle one it changes little
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            path = self.out_dir / self.manifest["entries"][entry]["file"]
            self._sessions[entry] = ort.InferenceSession(str(path), opts, providers=self.providers)
        return self._sessions[entry]

    def run_numpy(self, entry: str, *inputs: np.ndarray) -> list[np.ndarray]:
        spec = self.manifest["entries"].get(entry)
        if spec is None:
            raise KeyError(f"{self.out_dir} has no entry {entry!r}; it has {', '.join(self.manifest['entries'])}")
        arrays = [np.ascontiguousarray(a) for a in inputs]
        check_inputs(entry, spec["inputs"], arrays, self.manifest.get("dims", {}))
        alias = self._aliases(entry)
        if alias:  # fixed-capacity caches: written in place (inplace.py)
            return run_bound(self.session(entry), spec["inputs"], spec["outputs"], arrays, alias)
        feed = {s["name"]: a for s, a in zip(spec["inputs"], arrays)}
        return self.session(entry).run([o["name"] for o in spec["outputs"]], feed)

    def _aliases(self, entry: str) -> dict[str, str]:
        """The outputs of `entry` that share an input's buffer (CPU only: host memory)."""
        if not hasattr(self, "_alias"):
            self._alias = {}
        if entry not in self._alias:
            cpu = all(p in ("CPUExecutionProvider",) for p in self.providers)
            self._alias[entry] = aliases(self.out_dir / self.manifest["entries"][entry]["file"]) if cpu else {}
        return self._alias[entry]

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        arrays = [x.detach().contiguous().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
                  for x in inputs]
        return [torch.from_numpy(o if o.flags.writeable else o.copy()) for o in self.run_numpy(entry, *arrays)]
