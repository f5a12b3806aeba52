"""Golden snapshot of k3-tiny's TVM module as it is compiled (Relax functions and every TensorIR
function after scheduling), printed as TVMScript, for a named CPU so that the text does not
depend on the host: what a change to a lowering, a kernel or a schedule does to the generated
code shows here line by line. Regenerate after a deliberate change:
    K3C_UPDATE_GOLDEN=1 pytest tests/tvm/test_tvmscript_golden.py
"""

from __future__ import annotations

from pathlib import Path

from golden_files import check_golden

from k3c import passes
from k3c.backends.tvm import TvmBackend

GOLDEN = Path(__file__).parent / "golden" / "k3-tiny.x86-64-v3.tvmscript"
TARGET = "llvm -mcpu=x86-64-v3"  # AVX2 + FMA: every x86 CPU the project runs on has at least this


def test_k3_tiny_module_as_compiled(zoo):
    _, prefill, decode = zoo("k3-tiny")
    graphs = {"prefill": passes.run(prefill, "default"), "decode": passes.run(decode, "default")}
    text = TvmBackend(target=TARGET).show(graphs)
    assert "def prefill" in text and "def decode" in text and "T.prim_func" in text, text[:2000]
    check_golden(text, GOLDEN, "k3-tiny's TVM module", __file__)
