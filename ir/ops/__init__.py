"""The op table of the k3c IR: every op declared once (see spec.py), grouped by file."""

from . import (  # noqa: F401
    attention,
    cache,
    chunked,
    collectives,
    elementwise,
    fused,
    fused_norms,
    kda_decode,
    moe,
    nn,
    quant,
    recurrent,
    shape,
)
from .elementwise import broadcast_shapes
from .spec import FAMILIES, OPS, REQUIRED, Attr, OpSpec, ShapeError, attr, defop, expect, family, named_inputs
from .torch_ops import torch_op, torch_ops

__all__ = ["OPS", "FAMILIES", "OpSpec", "Attr", "attr", "ShapeError", "REQUIRED", "defop", "expect", "family",
           "named_inputs", "torch_op", "torch_ops", "broadcast_shapes"]
