"""Every IR op is complete (operands, inference, reference) and every backend either lowers
it or says why not; the support matrix in README.md is the one the code generates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import k3c
from k3c import backends
from k3c.backends import coverage
from k3c.backends.base import check_supported
from k3c.compiler import prepare
from k3c.ir.ops import OPS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_is_declared_whole(op):
    spec = OPS[op]
    assert callable(spec.infer) and callable(spec.ref), op
    assert spec.outputs, f"{op} declares no outputs"


def test_every_op_has_a_cell_in_every_column():
    rows = coverage.matrix()
    assert sorted(op for _, op, _ in rows) == sorted(OPS)
    for _, op, cells in rows:
        assert set(cells) == set(coverage.COLUMNS)
        for col, cell in cells.items():
            assert cell and (not cell.startswith("-") or "(" in cell), f"{op} on {col}: {cell!r} gives no reason"


def test_the_matrix_agrees_with_each_backend_supports():
    """A cell that says an op lowers agrees with the backend's own `supports` on a real node; a
    "decomposed" op is refused by `supports` and gone from the graphs the backend is handed."""
    model = k3c.models.build("k3-tiny")
    captured = k3c.capture_entries(model, (torch.randint(0, 100, (2, 16)),))
    g = k3c.passes.run(captured["prefill"], "default")
    for name in ("reference", "onnx", "tvm", "triton"):
        be = backends.get(name)
        cells = {op: cs[name] for _, op, cs in coverage.matrix()}
        for node in g.nodes:
            ok, why = be.supports(node, g)
            cell = cells[node.op]
            lowers = not cell.startswith("-") and cell != "decomposed"
            assert ok == lowers, f"{name}: {node.op}: matrix {cell!r}, supports {why!r}"
        handed = prepare(captured, be)["prefill"]
        assert not any(cells[n.op] == "decomposed" for n in handed.nodes), name
        check_supported(be, handed)


def test_readme_matrix_is_the_generated_one():
    text = (ROOT / "README.md").read_text()
    begin, end = "<!-- k3c ops: begin -->\n", "\n<!-- k3c ops: end -->"
    assert begin in text and end in text, "README.md lost the markers of the support matrix"
    copy = text.split(begin, 1)[1].split(end, 1)[0]
    assert copy == coverage.markdown(), "README.md's support matrix is stale: paste `k3c ops --markdown` into it"
