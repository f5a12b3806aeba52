"""A roofline projection of a Triton artifact's kernels on a GPU: FLOPs and bytes per IR op
from passes/cost.py (the one cost model), the dots each op's kernels run from kernels.json
(aot.py), and a GPU's published peaks. A projection, not a measurement:

    time = max(FLOPs / peak of the op's slowest dot kind, bytes / HBM bandwidth)

where bytes are what the op reads and writes once (cost.py's rule), so the time is a lower
bound that a kernel reaches only at the peaks; the dots of an op without any run on the CUDA
cores (the fp32 peak).

    rows = roofline("k3-triton", {"B": 1, "T": 8192, "P": 8192})
    print(markdown(rows))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...ir import Graph, named_inputs, parse
from ...passes import cost as C


@dataclass(frozen=True)
class Peaks:
    """Dense peaks of a GPU: FLOP/s by what a dot multiplies (as kernels.json's dot_kinds), and
    HBM bytes/s."""

    name: str
    flops: dict[str, float]
    hbm: float

    def peak(self, kinds: list[str]) -> tuple[str, float]:
        """The slowest of `kinds` (an op is as fast as its slowest dot); "fp32" without dots."""
        kinds = [k for k in kinds if k in self.flops] or ["fp32"]
        kind = min(kinds, key=lambda k: self.flops[k])
        return kind, self.flops[kind]


def _hopper(name: str, hbm: float) -> Peaks:
    """NVIDIA's H100/H200 SXM datasheet figures without sparsity: BF16/FP16 989 TFLOP/s, TF32
    494.7 TFLOP/s, FP32 (CUDA cores) 67 TFLOP/s. tf32x3 does three TF32 products per dot; an
    "ieee" dot is FMAs on the CUDA cores."""
    tf32 = 494.7e12
    return Peaks(name, {"bf16": 989e12, "f16": 989e12, "tf32": tf32, "tf32x3": tf32 / 3, "ieee": 67e12,
                        "fp32": 67e12}, hbm)


H200 = _hopper("H200", 4.8e12)  # HBM3e 4.8 TB/s
H100 = _hopper("H100 SXM", 3.35e12)  # HBM3 3.35 TB/s; the H800's compute and memory are the same
PEAKS = {"H200": H200, "H100": H100}


@dataclass(frozen=True)
class Row:
    entry: str
    op: str
    shape: str  # the first operand's static shape
    nodes: int  # nodes of this op and shape in the entry
    flops: int  # per node
    bytes: int  # per node
    dot: str  # the slowest dot kind of the op's kernels ("fp32": none)
    kernels: tuple[str, ...]

    @property
    def intensity(self) -> float:
        return self.flops / max(self.bytes, 1)

    def seconds(self, peaks: Peaks) -> float:
        """Per node: the larger of the compute and the memory time."""
        return max(self.flops / peaks.peak([self.dot])[1], self.bytes / peaks.hbm)

    def bound(self, peaks: Peaks) -> str:
        return "compute" if self.flops / peaks.peak([self.dot])[1] > self.bytes / peaks.hbm else "memory"


def roofline(out_dir: str | Path, sizes: dict[str, int]) -> list[Row]:
    """One row per (entry, IR op, operand shape) whose statement launches Triton kernels in the
    artifact at `out_dir` (its kernels.json says which), costed at the dims `sizes`."""
    out = Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    graphs = {e: parse((out / s["graph"]).read_text()) for e, s in manifest["entries"].items()}
    kernels = json.loads((out / "kernels.json").read_text())
    by_op: dict[str, list[dict]] = {}
    for k in kernels:
        for caller in k.get("launched_by", []):  # a "_scaled" template is its op's block-scaled form
            by_op.setdefault(caller.removeprefix("rt.").removesuffix("_scaled"), []).append(k)
    rows = []
    for entry, g in graphs.items():
        rows += _entry_rows(entry, g, sizes, by_op)
    return rows


def _entry_rows(entry: str, g: Graph, sizes: dict[str, int], by_op: dict[str, list[dict]]) -> list[Row]:
    env = C.binding(g, {d: sizes[d] for d in g.dims if d in sizes})
    groups: dict[tuple, list] = {}
    for node in g.nodes:
        if node.op not in by_op:
            continue
        cost = C.node_cost(g, node, env)
        first = next(iter(named_inputs(node).values()))  # the shape the kernels are listed by
        shape = "x".join(map(str, C.static_shape(g.types[first], env)))
        groups.setdefault((node.op, shape, cost.flops, cost.bytes), []).append(node)
    rows = []
    for (op, shape, flops, nbytes), nodes in groups.items():
        ks = [k for k in by_op[op] if any(entry == c.split()[0] for c in k.get("cases", []))] or by_op[op]
        kinds = sorted({kind for k in ks for kind in k.get("dot_kinds", [])})
        dot = H200.peak(kinds)[0] if kinds else "fp32"
        rows.append(Row(entry, op, shape, len(nodes), flops, nbytes, dot, tuple(sorted({k["name"] for k in ks}))))
    return sorted(rows, key=lambda r: (r.entry != "prefill", -r.nodes * r.seconds(H200)))


def markdown(rows: list[Row], peaks: Peaks = H200) -> str:
    """The rows as a Markdown table, with each entry's total."""
    lines = [f"| entry | op | first operand | nodes | GFLOP / node | MB / node | FLOP/B | dots | bound | "
             f"us / node on {peaks.name} | ms, all nodes | kernels |", "|" + "---|" * 12]
    totals: dict[str, float] = {}
    for r in rows:
        t = r.seconds(peaks)
        totals[r.entry] = totals.get(r.entry, 0.0) + t * r.nodes
        lines.append(f"| {r.entry} | `{r.op}` | {r.shape} | {r.nodes} | {r.flops / 1e9:.3g} | {r.bytes / 1e6:.3g} | "
                     f"{r.intensity:.1f} | {r.dot} | {r.bound(peaks)} | {t * 1e6:.3g} | {t * r.nodes * 1e3:.3g} | "
                     f"{', '.join(r.kernels)} |")
    for entry, t in totals.items():
        lines.append(f"| {entry} | **all these ops** | | | | | | | | | **{t * 1e3:.3g}** | |")
    return "\n".join(lines)


__all__ = ["Peaks", "H200", "H100", "PEAKS", "Row", "roofline", "markdown"]
