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

Targets: `cpu` (default), or `cuda`: built for onnxruntime's CUDA provider, where under
`compute="bf16"` the plain GEMMs multiply the stored BF16 weights with its BF16 MatMul
(passes/bf16_reads.py); such an artifact needs that provider, checked when it first runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...errors import UsageError
from ...ir import Graph, Node
from .. import tables as L
from ..artifact import seal
from .artifact import build_manifest, read_manifest, write_artifact
from .builder import LoweringError
from .lower import FLAVOURS, lower_graph
from .runner import OnnxRunner

TARGETS = ("cpu", "cuda")  # the execution provider an artifact is built for (OnnxBackend(target=))


class OnnxBackend:
    name = "onnx"
    compute_dtype = "f32"  # a BF16 model computes in float32 from its BF16 / MXFP4 weights (compute-dtype)
    reads_bf16 = True  # a BF16 embedding table gathered as stored (passes/bf16_reads.py; Gather takes BF16)

    def __init__(self, flavour: str = "portable", providers: list[str] | None = None, threads: int | None = None,
                 spinning: bool = False, target: str = "cpu"):
        if flavour not in FLAVOURS:
            raise ValueError(f"onnx flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
        if target not in TARGETS:
            raise UsageError(f"onnx target {target!r}: the targets are {', '.join(TARGETS)} (the execution "
                             "provider the artifact is built for)")
        self.flavour, self.providers, self.threads, self.spinning = flavour, providers, threads, spinning
        self.target = target

    @property
    def tables(self) -> tuple[str, ...]:
        """The lowering tables this flavour reads, in order (k3c.backends.tables)."""
        return ("onnx:ort", "onnx") if self.flavour == "ort" else ("onnx",)

    @property
    def chunk_size(self) -> int:
        """The chunk length of the chunked delta rule's bodies (both flavours run them for the
        ops onnxruntime has no kernel for): 32, not the pass's default 64. With C = 32 the
        bodies' [.., C, C] and [.., NB, C, K] tensors are half as large and the Scan over the
        chunks twice as long; side by side (kda, K = V = 64, portable) C = 32 took 0.82x to 0.96x
        the time of C = 64 at every H in {4, 16} and T in {512, 2048, 8192} (BENCHMARKS.md),
        and C = 16 was no faster overall (8% faster to 14% slower than 32)."""
        return 32

    @property
    def takes_whole(self) -> frozenset[str]:
        """Recurrent ops this flavour runs whole in prefill too: those onnxruntime's own kernel
        (LinearAttention) maps, so the chunk-delta-rule pass leaves them alone."""
        if self.flavour != "ort":
            return frozenset()
        from ...passes.chunk_delta_rule import chunkable

        return frozenset(op for op in chunkable() if op in L.load("onnx:ort"))

    @property
    def gemm_io(self) -> str | None:
        """"bf16" when built for onnxruntime's CUDA provider (`target="cuda"`, or that provider
        asked for first): its MatMul takes BF16 operands (docs/OperatorKernels.md: MatMul 13+,
        tensor(bfloat16)) and returns a BF16 product, so under `compute="bf16"` the plain GEMMs
        read the stored BF16 weights as they are (passes/bf16_reads.py). None elsewhere: the CPU
        provider's MatMul takes no BF16, so the weights are widened where read and multiplied in
        float32."""
        from .providers import CUDA, provider_name

        asked = [provider_name(p) for p in self.providers or []]
        return "bf16" if self.target == "cuda" or asked[:1] == [CUDA] else None

    def is_available(self) -> tuple[bool, str]:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as e:
            return False, f"onnx/onnxruntime not importable: {e}"
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        why = ""
        for table in self.tables:
            low, why = L.find(table, node, graph)
            if low is not None:
                return True, ""
        return False, why

    def lower(self, graphs: dict[str, Graph], out_dir: Path, *, model_config=None, pipeline=None) -> Path:
        """Write `graphs` ({"prefill": g, "decode": g} or {"forward": g}) as an artifact in out_dir."""
        from ..base import check_supported, legalized

        graphs = legalized(self, graphs)
        first = next(iter(graphs.values()))
        model = first.meta.get("model")
        config = _config(model_config if model_config is not None else first.meta.get("config"))
        pipeline = pipeline if pipeline is not None else first.meta.get("pipeline")
        from ... import __version__

        meta = {"k3c.model": model or "", "k3c.flavour": self.flavour, "k3c.pipeline": _json(pipeline),
                "k3c.config": _json(config), "k3c.version": __version__}
        models, reports = {}, {}
        for entry, g in graphs.items():
            check_supported(self, g)
            models[entry], reports[entry] = lower_graph(g, self.flavour, {**meta, "k3c.entry": entry})
        opsets = {e: next(o.version for o in m.opset_import if o.domain == "") for e, m in models.items()}
        manifest = build_manifest(graphs, self.flavour, reports, model=model, config=config, pipeline=pipeline,
                                  opsets=opsets, provider=_provider_needed(graphs))
        out = write_artifact(Path(out_dir), models, manifest)
        seal(out, backend=self.name, model=model, variant=self.flavour, graphs=graphs)
        return out

    def load(self, out_dir: Path) -> OnnxRunner:
        return OnnxRunner(out_dir, self.providers, self.threads, self.spinning)


def _provider_needed(graphs: dict[str, Graph]) -> str | None:
    """The provider the artifact cannot run without: CUDA's where a GEMM multiplies BF16."""
    from ...passes.bf16_reads import PLAIN_GEMMS
    from .providers import CUDA

    bf16 = any(n.op in PLAIN_GEMMS and g.types[n.outputs[0]].dtype == "bf16" for g in graphs.values() for n in g.nodes)
    return CUDA if bf16 else None


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
