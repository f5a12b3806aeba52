"""Which backend lowers which IR op, and how: the support matrix, read from the lowering
tables of k3c.backends.tables themselves (so it cannot drift from the code).

    rows = matrix()          # [(family, op, {column: cell})], one row per op of the IR
    print(markdown(rows))    # the table of README.md ("Backend x op support")

A cell says how the op runs on that backend, or "-" with the reason when it does not.
`k3c ops` prints it; tests/test_op_coverage.py checks that every op has a cell everywhere.
"""

from __future__ import annotations

from ..ir.ops import OPS
from ..ir.ops.delta_family import members
from . import tables as L

COLUMNS = ("reference", "onnx", "onnx --flavour ort", "tvm", "triton")

LEGEND = {
    "naive": "k3c's interpreter: the op's naive reference in torch",
    "std": "standard ONNX operators (opset 23)",
    "`domain::Op` or x": "onnxruntime's kernel where its semantics and shapes fit (backends/onnx/README.md), else x",
    "fn": "a node of the `k3c` domain whose body is an ONNX function (standard ops, Loop/Scan)",
    "relax": "Relax operators",
    "TIR": "a TensorIR kernel (TVMScript) with a schedule, called with call_tir",
    "kernel": "a Triton kernel template from kernels/<op>/triton/",
    "fused": "fused with its elementwise neighbours into one generated Triton kernel",
    "torch": "a torch call in the generated module (GEMMs, views, small reductions)",
    "decomposed": "no lowering of its own: the op's `decompose` rule rewrites it into ops the backend lowers",
    "user": "a lowering registered with k3c.backends.lowering outside k3c",
}

# The family a row is filed under: the first of these the op declares.
_FAMILY_ORDER = ("recurrent", "chunked", "attention", "moe", "fused", "norm", "matmul", "reduce", "index", "gather",
                 "elementwise", "shape", "constant")


def family_of(op: str) -> str:
    fams = OPS[op].families
    return next((f for f in _FAMILY_ORDER if f in fams), min(fams, default="-"))


def _cell(table: str, op: str) -> str | None:
    low = L.load(table).get(op)
    if low is not None:
        return low.kind
    return "decomposed" if OPS[op].decompose is not None else None


def matrix() -> list[tuple[str, str, dict[str, str]]]:
    """One row per IR op: (family, op, {column: cell}); a missing lowering gets "- (no lowering)"."""
    rows = []
    for op in sorted(OPS, key=lambda o: (family_of(o), o)):
        portable = _cell("onnx", op)
        ort = L.load("onnx:ort").get(op)
        cells = {"reference": "naive", "onnx": portable,
                 "onnx --flavour ort": f"{ort.kind} or {portable}" if ort is not None else portable,
                 "tvm": _cell("tvm", op), "triton": _cell("triton", op)}
        rows.append((family_of(op), op, {c: v or "- (no lowering)" for c, v in cells.items()}))
    return rows


def markdown(rows=None) -> str:
    rows = matrix() if rows is None else rows
    lines = ["| family | op | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    lines += [f"| {fam} | `{op}` | " + " | ".join(cells[c] for c in COLUMNS) + " |" for fam, op, cells in rows]
    lines += [""] + [f"- **{k}**: {v}" for k, v in LEGEND.items()]
    return "\n".join(lines)


def variants() -> dict[tuple[str, str], tuple[str, ...]]:
    """(table, op) -> the named forms its lowering emits, where it has several (the ONNX
    functions of an op whose activation or gate kind picks the body)."""
    return {(t, op): low.variants for t in L.TABLES for op, low in sorted(L.load(t).items())
            if len(low.variants) > 1}


def text(rows=None) -> str:
    rows = matrix() if rows is None else rows
    head = ("family", "op", *COLUMNS)
    body = [(fam, op, *(cells[c].replace("`", "") for c in COLUMNS)) for fam, op, cells in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *body]]
    forms = [f"  {t} {op}: {', '.join(names)}" for (t, op), names in variants().items()]
    delta = [f"  {op}: gate {form.gate}" for op, form in sorted(members().items())]
    return "\n".join(lines + (["", "forms chosen by attribute:"] + forms if forms else [])
                     + ["", "delta family (each backend's one family lowering, told the gate kind of the op's spec):"]
                     + delta)
