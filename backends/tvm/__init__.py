"""The TVM backend: a Relax module with TensorIR kernels and schedules, compiled with
`tvm.compile`, run in the Relax VM, exported as a shared library.

    be = TvmBackend(target="llvm")            # or "cuda" (builds anywhere, runs on a GPU)
    be.lower({"prefill": g, "decode": g2}, "DIR")   # DIR/lib.so, weights.safetensors, manifest.json
    runner = be.load("DIR")                   # needs only those three files
    logits, *state = runner.run("prefill", input_ids)

How it is put together (each a module of this package):
- lower.py: IR graphs -> one Relax IRModule (relax.BlockBuilder), one function per entry;
  the weights are function parameters after the graph inputs, never constants.
- relax_ops.py: standard ops -> relax.op.*;  kernel_ops.py: recurrent, attention, MoE, AttnRes,
  SiTU / gated MLP -> TensorIR kernels of k3c.kernels.<op>.tvm via call_tir;  chunk_ops.py:
  the chunked delta-rule pieces.
- schedules.py: llvm and cuda schedules of what Relax legalizes; the kernels carry their own.
- build.py: the pipeline (lift weight transforms, legalize, fuse, schedule, VM lowering),
  tvm.compile, export;  runner.py: the Relax VM runner;  target.py: targets by name.
"""

from __future__ import annotations

from pathlib import Path

from ...ir import Graph, Node
from .. import tables as L
from ..artifact import seal
from ..base import legalized
from . import cache
from .build import build, export, scheduled_module
from .dims import DimError, DimMap
from .runner import TvmRunner
from .target import parse


class TvmBackend:
    name = "tvm"
    compute_dtype = "f32"  # a BF16 model computes in float32 from its BF16 / MXFP4 weights (compute-dtype)

    def __init__(self, target: str = "llvm", arch: str | None = None):
        self.target, mcpu = parse(target)  # "llvm -mcpu=NAME": kernels for another CPU (target.py)
        self.options = {**({"arch": arch} if arch else {}), **({"mcpu": mcpu} if mcpu else {})}

    @property
    def chunk_by(self) -> str | None:
        """The prefill form of the recurrent ops: on a CPU (`llvm`) the cost model's choice
        (chunk-delta-rule by="flops": the recurrence, with fewer FLOPs, ran 2 to 2.4 times
        faster than the chunked kernels at T = 64 to 8192, BENCHMARKS.md); on `cuda` chunked."""
        return "flops" if self.target == "llvm" else None

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        low, why = L.find("tvm", node, graph)
        if low is None:
            return False, why
        dims = DimMap(graph)
        for v in node.outputs:
            for d in graph.types[v].shape:
                try:
                    dims.expr(d)
                except DimError as e:
                    return False, str(e)
        return True, ""

    def _opts(self, options: dict) -> tuple[str, dict]:
        opts = {**self.options, **options}
        target, mcpu = parse(opts.pop("target", None) or self.target)
        return target, {**opts, **({"mcpu": mcpu} if mcpu else {})}

    def lower(self, graphs: dict[str, Graph], out_dir: Path) -> Path:
        graphs = legalized(self, graphs)
        target, opts = self._opts({})
        out, k = Path(out_dir), cache.key(graphs, target, opts)
        ex, seconds = (None, 0.0) if cache.fetch(k, out) else build(graphs, target, **opts)
        out = export(ex, graphs, out, target, opts, seconds)
        cache.store(k, out)
        variant = f"{target} -mcpu={opts['mcpu']}" if "mcpu" in opts else target  # as --target named it
        seal(out, backend=self.name, model=next(iter(graphs.values())).meta.get("model"), variant=variant,
             graphs=graphs)
        return out

    def load(self, out_dir: Path) -> TvmRunner:
        return TvmRunner(out_dir)

    def show(self, graphs: dict[str, Graph], **options) -> str:
        """The scheduled module (Relax functions and TensorIR) as TVMScript text."""
        target, opts = self._opts(options)
        return scheduled_module(legalized(self, graphs), target, **opts).script(show_meta=False)


__all__ = ["TvmBackend", "TvmRunner"]
