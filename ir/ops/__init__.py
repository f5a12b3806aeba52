"""The op table of the k3c IR: every op declared once (see spec.py), grouped by file."""

from . import attention, chunked, elementwise, fused, moe, nn, recurrent, shape  # noqa: F401  (declare the ops)
from .spec import FAMILIES, OPS, REQUIRED, OpSpec, ShapeError, defop, expect, family

__all__ = ["OPS", "FAMILIES", "OpSpec", "ShapeError", "REQUIRED", "defop", "expect", "family"]
