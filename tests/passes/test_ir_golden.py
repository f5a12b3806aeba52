"""Golden snapshot of k3-tiny's IR after the default pipeline, prefill and decode, as the text
form prints it: what a change to the frontend or a pass does to the graph shows here, line by
line (weights by name and type, not data). Regenerate after a deliberate change:
    K3C_UPDATE_GOLDEN=1 pytest tests/passes/test_ir_golden.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_files import check_golden

from k3c import ir, passes

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("entry", ["prefill", "decode"])
def test_k3_tiny_after_default(zoo, entry):
    _, prefill, decode = zoo("k3-tiny")
    graph = prefill if entry == "prefill" else decode
    after = passes.run(graph, "default")
    text = str(after)
    assert ir.parse(text).structurally_equal(after), "the snapshot does not read back as the graph"
    assert str(ir.parse(text)) == text, "the snapshot does not print back to itself"
    check_golden(text, GOLDEN / f"k3-tiny.{entry}.k3c", f"k3-tiny's {entry} IR after default", __file__)
