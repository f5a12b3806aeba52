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
from ..artifact import seal
from ..base import table_supports
from ..signs import DECAY_INPUT, check_decays
from . import cache
from .build import build, export, scheduled_module
from .dims import DimError, DimMap
from .lower import LOWERINGS
from .runner import TvmRunner
from .target import KINDS

# ops whose TVM lowering is a TensorIR kernel that computes in float32
_FLOAT32_KERNELS = {"kda", "gated_delta_rule", "delta_rule", "linear_attention", "short_conv", "causal_attention",
                    "mla_attention", "mla_attention_absorbed", "attn_res_mix", "moe_gate_up", "moe_down",
                    "moe_experts", "situ", "gated_mlp", "chunk_prepare", "chunk_state_scan", "chunk_output"}


class TvmBackend:
    name = "tvm"

    def __init__(self, target: str = "llvm", **options):
        if target not in KINDS:
            raise ValueError(f"tvm: unknown target {target!r}; known: {', '.join(KINDS)}")
        self.target, self.options = target, options

    def is_available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, node: Node, graph: Graph) -> tuple[bool, str]:
        ok, why = table_supports(LOWERINGS, node, "tvm")
        if not ok:
            return ok, why
        if node.op == "moe_experts" and isinstance(graph.types[node.inputs[0]].shape[0], int):
            # TVM 0.27's FuseTIR fails on this lowering at a static token count ("Inconsistent
            # buffers T_reshape and x mapped to the same relax var"): say so instead
            return False, ("the TVM routed-expert lowering needs a dynamic token count (a static one, as "
                           "dynamic=False gives, trips TVM's FuseTIR); capture with dynamic=True")
        if node.op in DECAY_INPUT:
            ok, why = check_decays(graph, node, "TVM")
            if not ok:
                return ok, why
        if node.op in _FLOAT32_KERNELS:
            for v in node.inputs + node.outputs:
                t = graph.types[v]
                if t.dtype in ("f64", "f16", "bf16"):
                    return False, f"the TVM kernel of {node.op} computes in f32; %{v} is {t.dtype}"
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
        target = opts.pop("target", None) or self.target
        if target not in KINDS:
            raise ValueError(f"tvm: unknown target {target!r}; known: {', '.join(KINDS)}")
        return target, opts

    def lower(self, graphs: dict[str, Graph], out_dir: Path, **options) -> Path:
        target, opts = self._opts(options)
        out, k = Path(out_dir), cache.key(graphs, target, opts)
        ex, seconds = (None, 0.0) if cache.fetch(k, out) else build(graphs, target, **opts)
        out = export(ex, graphs, out, target, opts, seconds)
        cache.store(k, out)
        seal(out, backend=self.name, model=next(iter(graphs.values())).meta.get("model"), variant=target)
        return out

    def load(self, out_dir: Path, **options) -> TvmRunner:
        return TvmRunner(out_dir)

    def show(self, graphs: dict[str, Graph], **options) -> str:
        """The scheduled module (Relax functions and TensorIR) as TVMScript text."""
        target, opts = self._opts(options)
        return scheduled_module(graphs, target, **opts).script(show_meta=False)


__all__ = ["TvmBackend", "TvmRunner"]
