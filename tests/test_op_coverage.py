"""Every IR op has one signature wherever it is restated, and every backend either lowers
it or says why not; the support matrix in README.md is the one the code generates."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

import k3c
from k3c import backends
from k3c.backends import coverage
from k3c.backends.base import check_supported
from k3c.backends.onnx.functions import FUNCTIONS
from k3c.compiler import prepare
from k3c.ir.ops import OPS
from k3c.ir.ops.torch_ops import torch_ops

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_signature_is_one_signature(op):
    """An op's inputs and attributes are the spec's, in the spec's order, in every form that
    restates them: the torch op's schema (what models call and torch.export records), the ONNX
    function of the op's name (its inputs, outputs and its body's parameters)."""
    spec = OPS[op]
    assert spec.outputs, f"{op} declares no outputs"
    target = torch_ops().get(op)
    if target is not None:  # attributes of kind "rows" are the data's row count: not arguments
        want = [i.rstrip("?") for i in spec.inputs] + [a for a, s in spec.attr_specs.items() if s.kind != "rows"]
        assert [a.name for a in target._schema.arguments] == want, f"{op}: torch schema vs spec"
    fd = FUNCTIONS.get(op)
    if fd is not None:
        extra = ONNX_EXTRA_INPUTS.get(op, ())
        assert list(fd.inputs) == list(spec.tensor_inputs) + list(extra), f"{op}: ONNX function inputs vs spec"
        assert list(fd.outputs) == list(spec.outputs), f"{op}: ONNX function outputs vs spec"
        params = list(inspect.signature(fd.body).parameters)[1:1 + len(fd.inputs)]
        assert params == list(fd.inputs), f"{op}: the ONNX body's parameters vs its inputs"


@pytest.mark.parametrize("table", sorted(backends.tables.TABLES))
def test_every_lowering_takes_the_spec_inputs_by_name(table):
    """The walkers call `fn(ctx, node, **inputs)` with the spec's input names: each lowering
    accepts exactly those keywords. A parameter that is required names an input of the op; one
    with a default names an input of some op sharing the lowering (the delta family's `g`)."""
    lows = dict(backends.tables.load(table).items())
    shared: dict[int, set[str]] = {}
    for op, low in lows.items():
        shared.setdefault(id(low.fn), set()).update(OPS[op].tensor_inputs)
    for op, low in sorted(lows.items()):
        names = OPS[op].tensor_inputs
        sig = inspect.signature(low.fn)
        try:
            sig.bind(None, None, **dict.fromkeys(names))
        except TypeError as e:
            pytest.fail(f"{table} lowering of {op} does not take the spec's inputs {names}: {e}")
        params = list(sig.parameters.values())[2:]
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        required = {p.name for p in named if p.default is p.empty}
        assert required <= set(names), f"{table} lowering of {op} requires {sorted(required - set(names))}"
        extra = {p.name for p in named} - shared[id(low.fn)]
        assert not extra, f"{table} lowering of {op} takes {sorted(extra)}, no input of the ops it lowers"


def test_onnx_functions_are_the_forms_the_table_names():
    """Every k3c-domain function is a form some `onnx` entry may emit, and every form an entry
    names has a body: `supports` can say which node would need a missing one."""
    forms = {v for low in backends.tables.load("onnx").values() for v in low.variants}
    assert forms == set(FUNCTIONS)


def test_a_missing_form_is_a_supports_answer():
    g = k3c.ir.parse(SITU_IR)
    node = g.nodes[0]
    low = backends.tables.load("onnx")["situ"]
    assert low.check(node, g) == (True, "")
    fewer = dataclasses.replace(low, variants=("situ",))  # as if situ_identity_up had no body
    g.nodes[0].attrs["linear_beta"] = None
    ok, why = fewer.check(node, g)
    assert not ok and "situ_identity_up" in why


SITU_IR = """graph g {
  dim B in [1, inf]
  input %gate: f32[B, 8]
  input %up: f32[B, 8]
  %y: f32[B, 8] = situ(%gate, %up) {beta=4.0, linear_beta=25.0}
  output y = %y
}
"""


# Inputs an ONNX function takes beyond its op's spec, and why.
ONNX_EXTRA_INPUTS = {
    "chunk_output": ("length",),  # the true length T, to cut the last chunk's padding
}


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
