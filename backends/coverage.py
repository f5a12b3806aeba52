"""Which backend lowers which IR op, and how: the support matrix, read from the lowering
tables themselves (so it cannot drift from the code).

    rows = matrix()          # [(family, op, {column: cell})], one row per op of the IR
    print(markdown(rows))    # the table of README.md ("Backend x op support")

A cell says how the op runs on that backend, or "-" with the reason when it does not.
`k3c ops` prints it; tests/test_op_coverage.py checks that every op has a cell everywhere.
"""

from __future__ import annotations

from ..ir.ops import OPS

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
}


def _family(op: str) -> str:
    return OPS[op].infer.__module__.rsplit(".", 1)[-1]


def _onnx() -> tuple[dict[str, str], dict[str, str]]:
    from .onnx.custom import CUSTOM
    from .onnx.ort import ORT, plan_groups
    from .onnx.standard import STANDARD

    portable = {op: "std" for op in STANDARD} | {op: "fn" for op in CUSTOM}
    ort = dict(portable)
    for op, m in ORT.items():
        ort[op] = f"`{m.target}` or {portable[op]}"
    if plan_groups:  # the three chunk pieces of one delta rule map onto one kernel together
        for op in ("chunk_prepare", "chunk_state_scan", "chunk_output"):
            ort[op] = "`com.microsoft::LinearAttention` (the three together) or fn"
    return portable, ort


def _tvm() -> dict[str, str]:
    from .tvm.chunk_ops import CHUNK_LOWERINGS
    from .tvm.kernel_ops import KERNEL_LOWERINGS
    from .tvm.relax_ops import RELAX_LOWERINGS

    return {op: "relax" for op in RELAX_LOWERINGS} | {op: "TIR" for op in {**KERNEL_LOWERINGS, **CHUNK_LOWERINGS}}


def _triton() -> tuple[dict[str, str], dict[str, str]]:
    from .triton.elementwise import EXPR
    from .triton.lowering import KERNEL_OPS, LOWERINGS, REASONS

    cells = {}
    for op in LOWERINGS:
        cells[op] = "kernel" if op in KERNEL_OPS else "fused" if op in EXPR else "torch"
    return cells, REASONS


def matrix() -> list[tuple[str, str, dict[str, str]]]:
    """One row per IR op: (family, op, {column: cell}); a missing lowering gets "- (reason)"."""
    portable, ort = _onnx()
    tvm = _tvm()
    triton, triton_reasons = _triton()
    tables = {"reference": ({op: "naive" for op in OPS}, {}), "onnx": (portable, {}),
              "onnx --flavour ort": (ort, {}), "tvm": (tvm, {}), "triton": (triton, triton_reasons)}
    rows = []
    for op in sorted(OPS, key=lambda o: (_family(o), o)):
        cells = {}
        for col, (table, reasons) in tables.items():
            cells[col] = table.get(op) or f"- ({reasons.get(op, 'no lowering')})"
        rows.append((_family(op), op, cells))
    return rows


def markdown(rows=None) -> str:
    rows = matrix() if rows is None else rows
    lines = ["| family | op | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    lines += [f"| {fam} | `{op}` | " + " | ".join(cells[c] for c in COLUMNS) + " |" for fam, op, cells in rows]
    lines += [""] + [f"- **{k}**: {v}" for k, v in LEGEND.items()]
    return "\n".join(lines)


def text(rows=None) -> str:
    rows = matrix() if rows is None else rows
    head = ("family", "op", *COLUMNS)
    body = [(fam, op, *(cells[c].replace("`", "") for c in COLUMNS)) for fam, op, cells in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *body])
