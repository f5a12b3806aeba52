"""Golden snapshot of k3-tiny's ONNX graphs (default pipeline, both flavours): opsets,
inputs and outputs, op counts per domain and the k3c-domain function bodies. Not weights.

A change to the lowering, the passes or the frontend that changes the artifact shows here.
Regenerate after a deliberate change:  K3C_UPDATE_GOLDEN=1 pytest tests/onnx/test_golden.py
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import onnx

from k3c.backends.onnx import lower_graph
from k3c.backends.onnx.lower import _walk

GOLDEN = Path(__file__).parent / "golden" / "k3-tiny.txt"


def _counts(nodes) -> str:
    c = Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in _walk(nodes))
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items()))


def _value(v: onnx.ValueInfoProto) -> str:
    t = v.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) for d in t.shape.dim]
    return f"{v.name}: {onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name}[{', '.join(dims)}]"


def summary(model: onnx.ModelProto) -> list[str]:
    lines = ["opsets: " + ", ".join(f"{o.domain or 'ai.onnx'} {o.version}"
                                    for o in sorted(model.opset_import, key=lambda o: o.domain))]
    lines += ["input " + _value(v) for v in model.graph.input]
    lines += ["output " + _value(v) for v in model.graph.output]
    lines.append("graph: " + _counts(model.graph.node))
    for f in sorted(model.functions, key=lambda f: f.name):
        attrs = f"[{', '.join(f.attribute)}]" if f.attribute else ""
        lines.append(f"function {f.domain}::{f.name}{attrs}({', '.join(f.input)}) -> ({', '.join(f.output)}): "
                     + _counts(f.node))
    return lines


def render(graphs) -> str:
    out = [f"# {Path(__file__).name}: k3-tiny, default pipeline, ops and domains of each ONNX graph"]
    for flavour in ("portable", "ort"):
        for entry, g in graphs.items():
            model, _ = lower_graph(g, flavour)
            out.append(f"\n== {flavour} / {entry}")
            out.extend(summary(model))
    return "\n".join(out) + "\n"


def test_k3_tiny_golden(zoo_graphs):
    _, graphs = zoo_graphs("k3-tiny", "default")
    text = render(graphs)
    if os.environ.get("K3C_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file; create it with K3C_UPDATE_GOLDEN=1 pytest {__file__}"
    want = GOLDEN.read_text()
    if text != want:
        import difflib

        diff = "\n".join(difflib.unified_diff(want.splitlines(), text.splitlines(), "golden", "now", lineterm=""))
        raise AssertionError(f"k3-tiny's ONNX graphs changed (K3C_UPDATE_GOLDEN=1 to accept):\n{diff[:6000]}")
