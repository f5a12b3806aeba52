"""Golden snapshot of k3-tiny's ONNX graphs as onnx.printer prints them (the default
pipeline as each flavour runs it, both entries): every node, attribute and function body;
initializers by name, dtype and shape, not their data.

A change to the lowering, the passes or the frontend that changes the artifact shows here,
line by line. Regenerate after a deliberate change:
    K3C_UPDATE_GOLDEN=1 pytest tests/onnx/test_golden.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import onnx
import onnx.printer
import pytest

from k3c.backends.onnx import OnnxBackend, lower_graph
from k3c.compiler import prepare

GOLDEN = Path(__file__).parent / "golden"


def render(model: onnx.ModelProto) -> str:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    lines = []
    for t in m.graph.initializer:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name
        lines.append(f"initializer {t.name}: {dtype}[{', '.join(map(str, t.dims))}]")
    del m.graph.initializer[:]
    del m.metadata_props[:]  # the version and the config: not the graph's business
    return "\n".join(lines + [onnx.printer.to_text(m)]) + "\n"


@pytest.mark.parametrize("flavour", ["portable", "ort"])
@pytest.mark.parametrize("entry", ["prefill", "decode"])
def test_k3_tiny_golden(zoo_captured, flavour, entry):
    _, captured = zoo_captured("k3-tiny")
    graphs = prepare({entry: captured[entry]}, OnnxBackend(flavour))
    model, _ = lower_graph(graphs[entry], flavour)
    text = render(model)
    path = GOLDEN / f"k3-tiny.{flavour}.{entry}.txt"
    if os.environ.get("K3C_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file; create it with K3C_UPDATE_GOLDEN=1 pytest {__file__}"
    want = path.read_text()
    if text != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), text.splitlines(), "golden", "now", lineterm=""))
        raise AssertionError(f"k3-tiny's {flavour} {entry} graph changed (K3C_UPDATE_GOLDEN=1 to accept):\n"
                             f"{diff[:6000]}")
