"""k3c as a `transformers.exporters` backend: export format "k3c", its config, exporter and runner.

    import k3c.integrations.transformers                      # registers the backend
    from transformers.exporters import AutoHfExporter
    config = K3cExportConfig(backend="tvm")                   # or "onnx" (flavour=), "reference"
    exported = AutoHfExporter.from_config(config).export_for_generation(hf_model, {"input_ids": ids}, config)
    out = exported.runners["prefill"](input_ids=ids)          # out.logits, out.cache (k3c's state)
    out = exported.runners["decode"](input_ids=next_ids, cache=out.cache)

The transformers model is taken as it is in memory (hf_model.py maps its weights; nothing is
saved and read back) and compiled by `k3c.compile` with k3c's passes into one artifact that
holds every stage: prefill, decode (one token) and extend (more tokens onto a state). So
`export_for_generation` runs no `generate()` to capture stage inputs, and its "prefill" and
"decode" components are the same program; each runner takes the cache its own prefill
returned, a dict of named tensors (the eager k3c model's state), not a transformers Cache.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, UsageError
from . import MissingPackageError, require

require("transformers", "k3c.integrations.transformers", "transformers==5.24.0")
try:
    from transformers.exporters import ExportedComponent, ExportedModel, ExportMetadata, HfExporter, ModelRunner
    from transformers.exporters.auto import EXPORT_BACKENDS, register_backend
    from transformers.exporters.configs import ExportConfigMixin
    from transformers.modeling_outputs import CausalLMOutputWithPast
except ImportError:  # transformers before 5.x has no exporters package
    import transformers as _tf

    raise MissingPackageError(f"k3c.integrations.transformers needs transformers.exporters (transformers 5.x); "
                              f"transformers {_tf.__version__} has none (pip install transformers==5.24.0)") from None

EXPORT_FORMAT = "k3c"
PROGRAM_FILE = "k3c_program.json"
BACKENDS = ("onnx", "tvm", "reference", "triton")
# forward kwargs of a causal LM that say nothing the artifact's state does not already say
_IGNORED = ("position_ids", "cache_position", "use_cache", "return_dict", "output_attentions",
            "output_hidden_states", "logits_to_keep")


@dataclass
class K3cExportConfig(ExportConfigMixin):
    """How k3c compiles the model: `backend` ("onnx", "tvm", "reference", "triton"), the
    ONNX `flavour` ("portable", "ort"), the TVM `target` ("llvm", "cuda"), the pass
    pipeline, fixed-capacity caches (`max_context`), the compute policy of a BF16 model, and
    the folder the artifact is written to (`out_dir`; None: a new temporary folder)."""

    export_format: str = EXPORT_FORMAT
    backend: str = "onnx"
    flavour: str | None = None
    target: str | None = None
    passes: str = "default"
    max_context: int | None = None
    compute: str | None = None
    out_dir: str | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise UsageError(f"K3cExportConfig: backend={self.backend!r}; k3c's backends are {', '.join(BACKENDS)}")
        if self.flavour is not None and self.backend != "onnx":
            raise UsageError(f"K3cExportConfig: flavour={self.flavour!r} is an onnx option, backend is {self.backend}")
        if self.target is not None and self.backend != "tvm":
            raise UsageError(f"K3cExportConfig: target={self.target!r} is a tvm option, backend is {self.backend}")

    def backend_options(self) -> dict[str, Any]:
        return {k: v for k, v in (("flavour", self.flavour), ("target", self.target)) if v is not None}


class K3cProgram:
    """One k3c artifact (every stage of the model) and the graphs that name its inputs and outputs."""

    def __init__(self, path: Path, backend: str, options: dict[str, Any], graphs: dict, compiled=None):
        self.path, self.backend, self.options, self.graphs = Path(path), backend, dict(options), graphs
        self._compiled, self._loaded_with = compiled, {}

    def load(self, **runner_options) -> Any:
        """The CompiledModel over the artifact; loaded once per runner options and shared by the
        components (the prefill and decode runners use one session / one VM)."""
        from ..backends import get
        from ..compiler import CompiledModel

        if self._compiled is not None and (not runner_options or runner_options == self._loaded_with):
            return self._compiled
        be = get(self.backend, **{**self.options, **runner_options})
        self._compiled = CompiledModel(be.load(self.path), self.graphs, self.path, self.backend)
        self._loaded_with = runner_options
        return self._compiled


def _compile(model: torch.nn.Module, sample_inputs: dict, config: K3cExportConfig) -> K3cProgram:
    from .. import compile as k3c_compile
    from .hf_model import from_hf_model

    ids = sample_inputs.get("input_ids") if isinstance(sample_inputs, dict) else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        raise InputError("k3c exporter: sample_inputs must hold input_ids, an int64 tensor [batch, tokens]; "
                         f"got {sorted(sample_inputs) if isinstance(sample_inputs, dict) else type(sample_inputs)}")
    ours = from_hf_model(model)
    compiled = k3c_compile(ours, config.backend, (ids,), config.out_dir, passes=config.passes,
                           max_context=config.max_context, compute=config.compute, **config.backend_options())
    return K3cProgram(compiled.out_dir, config.backend, config.backend_options(), compiled.graphs, compiled)


def _metadata(model: torch.nn.Module, program: K3cProgram) -> ExportMetadata:
    from .. import __version__

    first = program.graphs["prefill"]
    state = {name: torch.empty(0) for name, _ in first.outputs[1:]}
    spec = torch.utils._pytree.tree_flatten(CausalLMOutputWithPast(logits=torch.empty(0), cache=state))[1]
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    ids = {"rank": 2, "shape": list(first.types[first.inputs[0]].shape), "dtype": "int64"}
    return ExportMetadata(
        architecture=type(model).__name__, packages={"k3c": __version__, "torch": torch.__version__},
        export_dtype=str(dtype).removeprefix("torch."), export_device="cpu",
        kwargs={"input_ids": json.loads(json.dumps(ids, default=str)), "cache": {"container": "dict"},
                "attention_mask": {"rank": 2, "dtype": "int64"}},
        out_spec=torch.utils._pytree.treespec_dumps(spec))


class K3cExporter(HfExporter):
    """Compiles a transformers causal LM (or a k3c model) with k3c into one artifact."""

    export_format = EXPORT_FORMAT
    config_class = K3cExportConfig
    program_prefix = "k3c_"
    program_suffix = ""  # a program is a folder: the artifact, its graphs' IR text, k3c_program.json

    def export_program(self, model, sample_inputs, config: K3cExportConfig) -> tuple[K3cProgram, ExportMetadata]:
        program = _compile(model, sample_inputs, config)
        return program, _metadata(model, program)

    def export_for_generation(self, model, sample_inputs, config, *, generation_config=None,
                              multi_token_decode: bool = False) -> ExportedModel:
        """Prefill and decode of one artifact, compiled once (no generate() is run: k3c captures
        each stage from the model itself; decode takes one token, extend several)."""
        if isinstance(config, dict) and not isinstance(config.get("export_format"), str):
            raise UsageError("k3c exporter: one artifact holds every stage, so it takes one config, not one per stage")
        component = self._export_component(model, sample_inputs, config)
        return ExportedModel({"prefill": component, "decode": ExportedComponent(component.program, component.metadata)},
                             self.export_format, config=getattr(model, "config", None),
                             generation_config=generation_config)

    @classmethod
    def save_program(cls, program: K3cProgram, path: str | Path) -> None:
        path = Path(path)
        shutil.copytree(program.path, path / "artifact")
        (path / "graphs").mkdir()
        for entry, g in program.graphs.items():
            (path / "graphs" / f"{entry}.k3c").write_text(str(g))
        (path / PROGRAM_FILE).write_text(json.dumps({"backend": program.backend, "options": program.options,
                                                     "entries": sorted(program.graphs)}, indent=2) + "\n")

    @classmethod
    def load_program(cls, path: str | Path) -> K3cProgram:
        from ..errors import ArtifactError
        from ..ir import parse

        path = Path(path)
        try:
            info = json.loads((path / PROGRAM_FILE).read_text())
            backend, options, entries = info["backend"], dict(info["options"]), list(info["entries"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ArtifactError(f"{path / PROGRAM_FILE}: not a k3c program this version reads ({err})") from None
        if backend not in BACKENDS or not all(isinstance(e, str) and e.isidentifier() for e in entries):
            raise ArtifactError(f"{path / PROGRAM_FILE}: backend {backend!r} or entries {entries} not k3c's")
        graphs = {e: parse((path / "graphs" / f"{e}.k3c").read_text()) for e in entries}
        return K3cProgram(path / "artifact", backend, options, graphs)

    @classmethod
    def program_files(cls, filename: str) -> list[str]:
        return [f"{filename}/{PROGRAM_FILE}"]


class K3cModelRunner(ModelRunner):
    """Runs a k3c program: no cache -> prefill; a cache and one token -> decode; more -> extend.
    Returns a CausalLMOutputWithPast whose `cache` is k3c's state (a dict of named tensors)."""

    def __init__(self, metadata: ExportMetadata, compiled):
        super().__init__(metadata)
        self.compiled = compiled

    @property
    def device(self) -> torch.device:
        providers = getattr(self.compiled.runner, "providers", None) or []
        return torch.device("cuda" if providers and providers[0] == "CUDAExecutionProvider" else "cpu")

    @classmethod
    def from_program(cls, program: K3cProgram, metadata: ExportMetadata, device=None,
                     providers: list | None = None) -> K3cModelRunner:
        """`device` "cpu" (default) or, for the onnx backend, "cuda" (onnxruntime's CUDA provider);
        `providers` is onnxruntime's own list and replaces the one `device` picks."""
        options = {}
        if providers is not None or (device is not None and torch.device(device).type == "cuda"):
            if program.backend != "onnx":
                raise UsageError(f"k3c runner: device/providers choose onnxruntime's providers; this program's "
                                 f"backend is {program.backend}")
            options["providers"] = providers or ["CUDAExecutionProvider"]
        elif device is not None and torch.device(device).type != "cpu":
            raise UsageError(f"k3c runner: device {device!r}; k3c programs run on 'cpu' or (onnx) 'cuda'")
        return cls(metadata, program.load(**options))

    def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs) -> CausalLMOutputWithPast:
        ids = kwargs.pop("input_ids", None)
        if not isinstance(ids, torch.Tensor):
            raise InputError("k3c runner: input_ids (int64 [batch, tokens]) is required")
        cache = kwargs.pop("cache", None)
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        _check_mask(kwargs.pop("attention_mask", None), ids)
        unknown = sorted(k for k, v in kwargs.items() if k not in _IGNORED and v is not None)
        if unknown:
            raise UsageError(f"k3c runner: does not take {', '.join(unknown)} (input_ids, cache, attention_mask)")
        with torch.no_grad():
            if cache is None:
                logits, state = self.compiled.prefill(ids)
            elif not isinstance(cache, dict):
                raise InputError(f"k3c runner: cache must be the state a k3c prefill returned (a dict of named "
                                 f"tensors), got {type(cache).__name__}")
            elif ids.shape[-1] == 1:
                logits, state = self.compiled.decode(ids, cache)
            else:
                logits, state = self.compiled.extend(ids, cache)
        return CausalLMOutputWithPast(logits=logits, cache=state)


def _check_mask(mask, ids: torch.Tensor) -> None:
    """Only an all-ones mask: the artifact runs every token (padded prompts: k3c's `lengths`)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or not bool((mask == 1).all()):
        raise InputError("k3c runner: attention_mask with padding is not taken; pass unpadded input_ids "
                         "(k3c.compile(..., max_context=N) runners take right-padded prompts with lengths=)")


def register() -> None:
    """Register export format "k3c" with transformers.exporters (done when this module is imported)."""
    backend = EXPORT_BACKENDS.get(EXPORT_FORMAT)
    if backend is None or backend.exporter is not K3cExporter:
        register_backend(K3cExporter, K3cModelRunner)


register()

__all__ = ["K3cExportConfig", "K3cExporter", "K3cModelRunner", "K3cProgram", "EXPORT_FORMAT", "register"]
