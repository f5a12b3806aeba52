"""ONNX lowering of the fixed-capacity cache write (ir/ops/cache.py): `TensorScatter`
(opset 24), which writes new[b, t] into row positions[b] + t of the cache along axis 1.

onnxruntime runs it in place when the present cache is bound to the past one's buffer (the
runner does so for every cache output made by a TensorScatter of its own input, inplace.py);
else it copies the cache once and writes the rows. The masked attention over the cache runs
its decomposition in standard ops (MatMul, Where over the positions, Softmax).
"""

from __future__ import annotations

from ...ir import named_inputs
from ..tables import builtin

# ops that need a newer default-domain opset than the artifacts' OPSET (lower.py imports it)
OPSET_OF = {"TensorScatter": 24}


def _supports(node, graph) -> tuple[bool, str]:
    if graph.types[named_inputs(node)["positions"]].dtype != "i64":
        return False, "TensorScatter takes int64 write indices"
    return True, ""


@builtin("onnx", "cache_write", kind="std", supports=_supports)
def _cache_write(lx, node, cache: str, new: str, positions: str) -> None:
    lx.b.TensorScatter(lx.x(cache), lx.x(new), lx.x(positions), outputs=lx.outs(node), axis=1)
