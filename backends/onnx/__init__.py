"""The ONNX backend: IR -> `DIR/prefill.onnx` + `DIR/decode.onnx` (+ weights.bin, manifest.json)
that stock onnxruntime runs, and a runner over them.

    be = OnnxBackend(flavour="portable")        # or "ort": onnxruntime's own kernels
    be.lower({"prefill": g1, "decode": g2}, out_dir)
    be.load(out_dir).run("prefill", input_ids)

Flavours (README.md has the op table):
  portable  recurrent and fused ops are nodes of the custom domain `k3c` whose bodies are
            ONNX functions of standard ops (Scan/Loop for recurrences), shipped in the model
  ort       the same graph with onnxruntime's kernels where their semantics match exactly
            (com.microsoft LinearAttention, CausalConvWithState, MoE; RMSNormalization, Attention)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...ir import Graph, Node
from ..artifact import seal
from .artifact import build_manifest, read_manifest, write_artifact
from .builder import LoweringError
from .custom import CUSTOM, DEFAULT_CHUNK_SIZE
from .lower import FLAVOURS, lower_graph
from .runner import OnnxRunner
from .standard import STANDARD

_FLOATS_OF_CUSTOM = ("f32",)


class OnnxBackend:
    name = "onnx"

    def __init__(self, flavour: str = "portable", chunk_size: int | None = DEFAULT_CHUNK_SIZE,
                 providers: list[str] | None = None):
        if flavour not in FLAVOURS:
            raise ValueError(f"onnx flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
        self.flavour, self.chunk_size, self.providers = flavour, chunk_size, providers

    def is_available(self) -> tuple[bool, str]:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as e:
            return False, f"onnx/onnxruntime not importable: {e}"
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        if node.op in STANDARD:
            dts = {graph.types[v].dtype for v in node.inputs + node.outputs}
            if "bf16" in dts and node.op in ("const", "full"):
                return False, "bf16 constants have no ONNX lowering here"
            return True, ""
        if node.op in CUSTOM:
            floats = {graph.types[v].dtype for v in node.inputs + node.outputs} - {"i64", "i32", "bool"}
            if not floats <= set(_FLOATS_OF_CUSTOM):
                return False, f"the k3c-domain body of {node.op} is f32 only (got {', '.join(sorted(floats))})"
            return True, ""
        return False, f"op {node.op!r} has no ONNX lowering"

    def lower(self, graphs: dict[str, Graph], out_dir: Path, *, flavour: str | None = None,
              chunk_size: int | None = None, model_config=None, pipeline=None, **options) -> Path:
        """Write `graphs` ({"prefill": g, "decode": g} or {"forward": g}) as an artifact in out_dir."""
        for run_option in ("providers", "threads", "spinning"):  # k3c.compile passes them to both steps
            options.pop(run_option, None)
        _no_unknown(options, "lower")
        flavour = flavour or self.flavour
        if flavour not in FLAVOURS:
            raise ValueError(f"onnx flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
        chunk = self.chunk_size if chunk_size is None else chunk_size
        first = next(iter(graphs.values()))
        model = first.meta.get("model")
        config = _config(model_config if model_config is not None else first.meta.get("config"))
        pipeline = pipeline if pipeline is not None else first.meta.get("pipeline")
        from ... import __version__

        meta = {"k3c.model": model or "", "k3c.flavour": flavour, "k3c.pipeline": _json(pipeline),
                "k3c.config": _json(config), "k3c.version": __version__}
        models, reports = {}, {}
        for entry, g in graphs.items():
            from ..base import check_supported

            check_supported(self, g)
            models[entry], reports[entry] = lower_graph(g, flavour, chunk, {**meta, "k3c.entry": entry})
        manifest = build_manifest(graphs, flavour, reports, model=model, config=config, pipeline=pipeline,
                                  chunk_size=chunk)
        out = write_artifact(Path(out_dir), models, manifest)
        seal(out, backend=self.name, model=model, variant=flavour)
        return out

    def load(self, out_dir: Path, *, providers: list[str] | None = None, threads: int | None = None,
             spinning: bool = False, **options) -> OnnxRunner:
        for lower_option in ("flavour", "chunk_size", "model_config", "pipeline"):  # the artifact says these
            options.pop(lower_option, None)
        _no_unknown(options, "load")
        return OnnxRunner(out_dir, providers or self.providers, threads, spinning)


def _no_unknown(options: dict, where: str) -> None:
    if options:
        raise TypeError(f"onnx backend {where}: unknown option(s) {sorted(options)}; "
                        f"known: flavour, chunk_size, providers, threads, spinning, model_config, pipeline")


def _config(config):
    if config is None:
        return None
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return dict(config)


def _json(x) -> str:
    import json

    return json.dumps(x, sort_keys=True, default=str)


__all__ = ["OnnxBackend", "OnnxRunner", "LoweringError", "lower_graph", "read_manifest", "FLAVOURS"]
