"""Running an ONNX artifact with onnxruntime: `OnnxRunner(out_dir).run("decode", ids, *state)`.

Inputs are checked against the manifest before onnxruntime sees them, so a wrong state
shape is an `InputError` naming the input and the shape it expects, not a runtime crash; ids,
positions and lengths against what the entry indexes (backends/contract.py). The manifest is
data: every field is checked when the runner starts, and its dims are parsed by k3c's bounded
parser, never evaluated.
The CUDA provider is used when onnxruntime has it, else the CPU provider. Worker threads
do not spin between ops by default (`spinning=True` restores onnxruntime's default).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import sympy
import torch

from ...errors import ArtifactError, InputError, UsageError
from ..artifact import listed, verify
from ..contract import check_limits
from ..manifest import evaluate
from .artifact import check_manifest
from .inplace import aliases, as_numpy, ortvalue, run_bound
from .providers import check_session, provider_name, resolve


def default_providers() -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def _fmt(spec: dict) -> str:
    return f"{spec['dtype']}[{', '.join(str(d) for d in spec['shape'])}]"


def check_inputs(entry: str, specs: list[dict], arrays: list[np.ndarray], dims: dict,
                 parsed: dict | None = None) -> dict[str, int]:
    """Bind the symbolic dims from the inputs; an InputError names the first misfit. `parsed`:
    the entry's check_manifest result (its shapes parsed, its limits)."""
    if len(arrays) != len(specs):
        names = ", ".join(s["name"] for s in specs)
        raise InputError(f"{entry} takes {len(specs)} inputs ({names}), got {len(arrays)}")
    shapes = parsed["shapes"] if parsed else [list(s["shape"]) for s in specs]
    env: dict[str, int] = {}
    for spec, shape, a in zip(specs, shapes, arrays):
        if a.dtype.name != spec["dtype"] or a.ndim != len(shape):
            got = f"{a.dtype.name}{list(a.shape)}"
            raise InputError(f"{entry} input {spec['name']!r}: expected {_fmt(spec)}, got {got}")
        for d, n in zip(shape, a.shape):
            if isinstance(d, sympy.Symbol):
                env.setdefault(d.name, int(n))
    for spec, shape, a in zip(specs, shapes, arrays):
        for axis, (d, n) in enumerate(zip(shape, a.shape)):
            want = evaluate(d, env, f"{entry} input {spec['name']!r} dim {axis}")
            if int(n) != want:
                raise InputError(f"{entry} input {spec['name']!r}: expected {_fmt(spec)} with "
                                 f"{', '.join(f'{k}={v}' for k, v in env.items())}, got {list(a.shape)} "
                                 f"(dim {axis} is {n}, expected {want})")
    for name, (lo, hi) in dims.items():
        if name in env and (env[name] < lo or (hi is not None and env[name] > hi)):
            raise InputError(f"{entry}: dim {name} = {env[name]} is outside [{lo}, {hi if hi is not None else 'inf'}]")
    if parsed:
        check_limits(entry, parsed["limits"], [s["name"] for s in specs], arrays)
    return env


class OnnxRunner:
    """Runs the entries of an artifact; inputs and outputs in the manifest's order."""

    def __init__(self, out_dir: str | Path, providers: list[str] | None = None, threads: int | None = None,
                 spinning: bool = False):
        self.out_dir = Path(out_dir)
        manifest = verify(self.out_dir, "onnx")  # every file present and undamaged before onnxruntime maps it
        self._parsed = check_manifest(manifest, self.out_dir / "manifest.json")
        for entry, spec in manifest["entries"].items():
            listed(self.out_dir, manifest, spec["file"], f"entries.{entry}.file")
        if "weights" in manifest:
            listed(self.out_dir, manifest, manifest["weights"], "weights")
        self.manifest = manifest
        needed = manifest.get("provider")  # CUDA's for an artifact of BF16 GEMMs (target="cuda")
        self.asked_providers = providers  # None: the default, which may fall back to the CPU
        self._providers = None
        if providers is None and needed:  # built for that provider: checked at the first run, so
            self.asked_providers = [needed]  # such an artifact loads where it was built, as TVM's cuda ones do
        else:
            self._check_needed(self.providers)
        self.threads, self.spinning = threads, spinning
        self._sessions: dict = {}
        self.entries: dict[str, dict] = self.manifest["entries"]  # file, inputs, outputs of each graph

    @property
    def providers(self) -> list:
        """The provider list the sessions get: each asked for (this onnxruntime must have it),
        the CPU provider appended (providers.py)."""
        if self._providers is None:
            import onnxruntime as ort

            self._providers = resolve(self.asked_providers, ort.get_available_providers(), ort.__version__)
        return self._providers

    def _check_needed(self, providers: list) -> None:
        needed = self.manifest.get("provider")
        if needed and needed not in [provider_name(p) for p in providers]:
            raise UsageError(f"{self.out_dir} multiplies BF16 GEMMs on onnxruntime's {needed} (built for it, "
                             f"compute='bf16'), which this session would not use (providers "
                             f"{', '.join(provider_name(p) for p in providers)}); the CPU provider has no "
                             f"BF16 MatMul: run it with providers=['{needed}'], or build it for the CPU")

    def session(self, entry: str):
        if entry not in self.manifest["entries"]:
            raise UsageError(f"{self.out_dir} has no entry {entry!r}; it has {', '.join(self.manifest['entries'])}")
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
            self._check_external_data(path)
            session = ort.InferenceSession(str(path), opts, providers=self.providers)
            check_session(session, self.asked_providers or [], ort.__version__)  # no silent CPU fallback
            self._sessions[entry] = session
        return self._sessions[entry]

    def _check_external_data(self, path: Path) -> None:
        """Every tensor an entry keeps outside its file lies in a file the manifest lists (so
        checked), never elsewhere: onnxruntime would read wherever the model says."""
        import onnx
        from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as err:  # protobuf's DecodeError and friends: the file is no ONNX model
            raise ArtifactError(f"{path}: not an ONNX model onnx reads ({type(err).__name__})") from None
        for t in _get_all_tensors(model):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                listed(self.out_dir, self.manifest, ExternalDataInfo(t).location, f"{path.name} tensor {t.name!r}")

    def run_numpy(self, entry: str, *inputs: np.ndarray) -> list[np.ndarray]:
        spec = self.manifest["entries"].get(entry)
        if spec is None:
            raise UsageError(f"{self.out_dir} has no entry {entry!r}; it has {', '.join(self.manifest['entries'])}")
        arrays = [np.ascontiguousarray(a) for a in inputs]
        check_inputs(entry, spec["inputs"], arrays, self.manifest["dims"], self._parsed[entry])
        alias = self._aliases(entry)
        if alias:  # fixed-capacity caches: written in place (inplace.py)
            return run_bound(self.session(entry), spec["inputs"], spec["outputs"], arrays, alias)
        names = [o["name"] for o in spec["outputs"]]
        if any(s["dtype"] == "bfloat16" for s in spec["inputs"] + spec["outputs"]):  # state_dtype="bf16"
            feed = {s["name"]: ortvalue(a) for s, a in zip(spec["inputs"], arrays)}
            return [as_numpy(v) for v in self.session(entry).run_with_ort_values(names, feed)]
        feed = {s["name"]: a for s, a in zip(spec["inputs"], arrays)}
        return self.session(entry).run(names, feed)

    def _aliases(self, entry: str) -> dict[str, str]:
        """The outputs of `entry` that share an input's buffer (CPU only: host memory)."""
        if not hasattr(self, "_alias"):
            self._alias = {}
        if entry not in self._alias:
            cpu = all(p in ("CPUExecutionProvider",) for p in self.providers)
            self._alias[entry] = aliases(self.out_dir / self.manifest["entries"][entry]["file"]) if cpu else {}
        return self._alias[entry]

    def run(self, entry: str, *inputs: torch.Tensor) -> list[torch.Tensor]:
        arrays = [_to_numpy(x) if isinstance(x, torch.Tensor) else np.asarray(x) for x in inputs]
        return [_to_torch(o if o.flags.writeable else o.copy()) for o in self.run_numpy(entry, *arrays)]


def _to_numpy(x: torch.Tensor) -> np.ndarray:
    """numpy has no bfloat16: a BF16 tensor becomes an ml_dtypes array over the same bits."""
    x = x.detach().contiguous().cpu()
    if x.dtype != torch.bfloat16:
        return x.numpy()
    import ml_dtypes

    return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def _to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
