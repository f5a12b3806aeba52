"""k3c.passes: the pass manager and one file per pass.

    k3c.passes.run(graph, "default")          # or a list of pass names, or "none"
    k3c.passes.run(graph, ["constant-fold", "chunk-delta-rule{chunk_size=32}", "dce"])

Passes (each a file): constant-fold, cse, dce, fuse-situ, fuse-norms, fold-latent-moe,
chunk-delta-rule. A new pass registers itself with `register_pass` (see passes/README.md);
`legalize` decomposes what a backend cannot lower.
"""

from __future__ import annotations

if __name__ != "k3c.passes":  # imported under its bare name, e.g. from the repository root: kernels/bare_name.py
    import os as _os
    import runpy as _runpy  # by path: under a bare name there is no package to import the guard from

    _runpy.run_path(_os.path.join(_os.path.dirname(_os.path.dirname(__file__)), "kernels", "bare_name.py"))[
        "guard"](globals())  # a probe gets a stand-in that holds nothing; an import statement, the error


from ..ir import Graph
from ..registry import Registry
from . import (  # noqa: F401  (register the passes)
    bf16_reads,
    chunk_delta_rule,
    compute_dtype,
    constant_fold,
    cse,
    dce,
    decompose,
    fold_latent_moe,
    fold_mxfp4,
    fuse_kda_decode,
    fuse_norms,
    fuse_situ,
    last_token_logits,
    state_dtype,
)
from .builder import Builder
from .cost import COST_AT, Cost, graph_cost
from .driver import Rule, apply_rules
from .legalize import decompose_node, legalize
from .pattern import Alt, Any, Const, Match, Op, Opt, Product, Weight, maybe_cast
from .pipeline import (
    PassReport,
    PassVerifyError,
    backend_choices,
    check_steps,
    for_backend,
    format_report,
    run_pipeline,
)
from .registry import PASSES, register_pass, rule_pass

PIPELINES: Registry = Registry("pipeline")
PIPELINES.add("none", [])
# fold weight-only subgraphs first (so later patterns see weights), MXFP4 experts in their
# canonical form (decode + the dense op) for the fusions, fuse the activations and norms before
# merging GEMMs (gate/up belong to gated_mlp), fold the decodes back into the fused experts,
# chunk last, then sweep.
PIPELINES.add("default", ["constant-fold", "cse", 'decompose{ops=["moe_down_mxfp4", "moe_gate_up_mxfp4"]}',
                          "fuse-situ", "fuse-norms", "fold-latent-moe", "fold-mxfp4", "chunk-delta-rule", "dce"])


def steps_of(pipeline: str | list[str]) -> list:
    """The steps of a pipeline name in PIPELINES, or of a list of pass names."""
    if isinstance(pipeline, str):
        if pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {pipeline!r}; known: {', '.join(PIPELINES)}")
        return list(PIPELINES[pipeline])
    return list(pipeline)


def check_pipeline(pipeline: str | list[str], *, stop_after: str | None = None,
                   dump_after: str | None = None) -> None:
    """Raise ValueError (one line) for an unknown pipeline, pass or option, or a stage not in it."""
    check_steps(steps_of(pipeline), stop_after, dump_after)


def run(graph: Graph, pipeline: str | list[str] = "default", *, verify_each: bool = True,
        stop_after: str | None = None, dump_after: str | None = None, report: list | None = None) -> Graph:
    """Run a pipeline (a name in PIPELINES or a list of pass names) on a copy of `graph`.

    stop_after: return the graph as it is after that pass; dump_after: print the IR after it;
    report: a list that receives one PassReport per pass (sites per rule, node count,
    estimated FLOPs and bytes before/after at COST_AT, time). The input is never modified.
    """
    return run_pipeline(graph, steps_of(pipeline), verify_each=verify_each, stop_after=stop_after,
                        dump_after=dump_after, report=report)


__all__ = ["run", "check_pipeline", "steps_of", "for_backend", "backend_choices", "legalize", "decompose_node",
           "PIPELINES", "PASSES", "register_pass", "rule_pass", "apply_rules", "Rule", "Builder", "Match", "Op", "Opt",
           "Any", "Const", "Weight", "Alt", "Product", "maybe_cast", "PassReport", "PassVerifyError", "format_report",
           "COST_AT", "Cost", "graph_cost"]
