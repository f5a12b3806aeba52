"""Pipelines: a flat list of pass steps run on a copy of a graph, verified between steps, with
a report of what each pass changed.

    run_pipeline(graph, ["constant-fold", "chunk-delta-rule{chunk_size=32}", "dce"])
    for_backend(steps, keep={"kda"})   # a backend that takes kda whole: chunk-delta-rule keeps it
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from ..ir import Graph, VerifyError, verify
from . import cost as C
from .driver import drop_unused_weights
from .fuse_kda_decode import FUSED as FUSED_DECODE
from .registry import PASSES, format_step, parse_step


@dataclass
class PassReport:
    """What one pass changed: sites per rule, node count, estimated cost, time."""

    name: str
    graph: str
    sites: dict[str, int]
    nodes_before: int
    nodes_after: int
    flops_before: int
    flops_after: int
    bytes_before: int
    bytes_after: int
    seconds: float

    @property
    def total_sites(self) -> int:
        return sum(self.sites.values())

    def __str__(self) -> str:
        rules = ", ".join(f"{k} {v}" for k, v in self.sites.items()) or "no change"
        return (f"{self.name:<20} {self.total_sites:>4} sites  nodes {self.nodes_before:>5} -> {self.nodes_after:<5}"
                f" GFLOP {self.flops_before / 1e9:9.3f} -> {self.flops_after / 1e9:<9.3f}"
                f" MB {self.bytes_before / 1e6:9.1f} -> {self.bytes_after / 1e6:<9.1f}"
                f" {self.seconds * 1e3:7.1f} ms  ({rules})")


def format_report(entries: list[PassReport]) -> str:
    at = ", ".join(f"{k}={v}" for k, v in C.COST_AT.items())
    lines = [f"pass report (cost estimated at {at})"]
    for graph in dict.fromkeys(e.graph for e in entries):
        lines.append(f"{graph}:")
        lines.extend("  " + str(e) for e in entries if e.graph == graph)
    return "\n".join(lines)


class PassVerifyError(VerifyError):
    """A pass produced a graph the verifier rejects (a bug in the pass): names the pass."""

    def __init__(self, pass_name: str, err: VerifyError):
        Exception.__init__(self, f"after pass {pass_name!r}: {err}")
        self.rule, self.node, self.pass_name = err.rule, err.node, pass_name


def check_steps(steps: list, stop_after: str | None = None, dump_after: str | None = None) -> list[tuple[str, dict]]:
    """Parse and check a pipeline's steps before anything runs; a ValueError says what is wrong."""
    parsed = [parse_step(s) for s in steps]
    names = [n for n, _ in parsed]
    for what, want in (("stop_after", stop_after), ("dump_after", dump_after)):
        if want is not None and want not in names:
            raise ValueError(f"{what}: pass {want!r} is not in the pipeline ({', '.join(names) or 'empty'})")
    return parsed


def backend_choices(be) -> dict:
    """What a backend says about the pipeline it runs (k3c.backends.base): the recurrent ops
    it takes whole (`takes_whole`), whether the cost model picks the prefill form
    (`chunk_by`), the chunk length its chunked pieces run fastest at (`chunk_size`), the fused
    decode ops it lowers (`fuse`), whether its runtime reads BF16 weights as stored
    (`reads_bf16`) and the dtype its runtime's BF16 GEMMs return (`gemm_io`)."""
    return {"keep": getattr(be, "takes_whole", ()), "chunk_by": getattr(be, "chunk_by", None),
            "chunk_size": getattr(be, "chunk_size", None), "fuse": _lowered(be, FUSED_DECODE),
            "reads_bf16": getattr(be, "reads_bf16", False), "gemm_io": getattr(be, "gemm_io", None)}


def _lowered(be, ops: tuple[str, ...]) -> tuple[str, ...]:
    """The ops of `ops` that backend `be` has a lowering of its own for (its table)."""
    from ..backends import tables

    name = getattr(be, "name", None)
    if name not in tables.TABLES:
        return ()
    table = tables.load(name)
    return tuple(op for op in ops if op in table)


def for_backend(steps: list, keep=(), compute: str | None = None, chunk_by: str | None = None,
                chunk_size: int | None = None, state_dtype: str | None = None, fuse=(), reads_bf16: bool = False,
                gemm_io: str | None = None) -> list:
    """`steps` as a backend needs them: the ops it takes whole (`keep`) stay whole through
    chunk-delta-rule (the one place the prefill form is decided), a backend that lets the
    cost model pick the form (`chunk_by="flops"`) or prefers a chunk length (`chunk_size`)
    says so to that pass unless the pipeline already does, and a backend that computes in
    one dtype gets compute-dtype before the final sweep (`compute`: "f32", the CPU
    backends' default for a BF16 model, or "bf16", the BF16 GEMM policy), and a recurrent
    state held in BF16 (`state_dtype="bf16"`) gets state-dtype after it, at the graph's
    boundary as it is lowered. A backend that lowers KDA's fused decode step (`fuse`, ops of
    fuse_kda_decode.FUSED) gets fuse-kda-decode right after fuse-norms, whose l2norm and
    gated_rms_norm it matches; for a model held in a lower precision, right after
    compute-dtype instead, behind a second fuse-norms: the pass takes float32 sites only, and
    the gated norm of a BF16 model is one only once compute-dtype has dropped its casts. A
    backend whose runtime reads BF16 weights as stored (`reads_bf16`) gets bf16-reads right
    after compute-dtype, with its GEMMs under `compute="bf16"` where the runtime multiplies
    BF16 tensors into a BF16 product (`gemm_io="bf16"`). Steps stay text, so the pipeline an
    artifact records reads back."""
    keep = sorted(set(keep))
    fuse_decode = bool(set(fuse) & set(FUSED_DECODE)) and not any(parse_step(s)[0] == "fuse-kda-decode"
                                                                   for s in steps)
    add_compute = compute is not None and not any(parse_step(s)[0] == "compute-dtype" for s in steps)
    out = []
    for step in steps:
        name, given = parse_step(step)
        if name == "fuse-norms" and fuse_decode and not add_compute:
            out += [step, "fuse-kda-decode"]
            continue
        opts = given
        if name == "chunk-delta-rule":
            if keep:
                opts = {**opts, "keep": sorted(set(opts.get("keep", [])) | set(keep))}
            if chunk_by is not None and "by" not in opts:
                opts = {**opts, "by": chunk_by}
            if chunk_size is not None and "chunk_size" not in opts:
                opts = {**opts, "chunk_size": int(chunk_size)}
            step = format_step(name, opts) if opts != given else step
        out.append(step)
    if add_compute:
        at = len(out) - 1 if out and parse_step(out[-1])[0] == "dce" else len(out)
        opts = {"dtype": "f32", **({"gemm": "bf16"} if compute == "bf16" else {})}
        gemms = {} if compute == gemm_io == "bf16" else {"gemms": False}
        reads = [format_step("bf16-reads", gemms)] if reads_bf16 else []
        fused = ["fuse-norms", "fuse-kda-decode"] if fuse_decode else []
        out[at:at] = [format_step("compute-dtype", opts), *reads, *fused]
    if state_dtype not in (None, "f32") and not any(parse_step(s)[0] == "state-dtype" for s in out):
        at = len(out) - 1 if out and parse_step(out[-1])[0] == "dce" else len(out)
        out.insert(at, format_step("state-dtype", {"dtype": state_dtype}))
    return out


def run_pipeline(graph: Graph, steps: list, *, verify_each: bool = True, stop_after: str | None = None,
                 dump_after: str | None = None, report: list | None = None, out=None) -> Graph:
    parsed = check_steps(steps, stop_after, dump_after)
    g = graph.copy()
    if verify_each:
        verify(g)
    before = C.graph_cost(g) if report is not None else None
    for name, opts in parsed:
        nodes_before = len(g.nodes)
        t0 = time.perf_counter()
        sites = PASSES[name].fn(g, **opts) or {}
        drop_unused_weights(g)
        g.prune_types()
        seconds = time.perf_counter() - t0
        if verify_each:
            try:
                verify(g)
            except VerifyError as e:
                raise PassVerifyError(name, e) from None
        if report is not None:
            after = C.graph_cost(g)
            report.append(PassReport(name, g.name, dict(sites), nodes_before, len(g.nodes), before.flops, after.flops,
                                     before.bytes, after.bytes, seconds))
            before = after
        if dump_after == name:
            print(f"// IR after {name}", file=out or sys.stdout)
            print(g, end="", file=out or sys.stdout)
        if stop_after == name:
            break
    return g
