"""Routed experts in Triton (grouped.py): a grouped GEMM over tokens sorted by expert; on MXFP4
experts (mxfp4.py) the same GEMM decoding the codes in the kernel, and on the block-scaled
tensor cores of sm_100 (mxfp4_scaled.py) the codes fed to `tl.dot_scaled` as stored, against
activations quantized to MXFP8. References: ../naive.py, ../mxfp4.py."""

from .grouped import moe_down, moe_experts, moe_gate_up, sort_by_expert
from .mxfp4 import moe_down_mxfp4, moe_experts_mxfp4, moe_gate_up_mxfp4
from .mxfp4_scaled import moe_down_mxfp4_scaled, moe_experts_mxfp4_scaled, moe_gate_up_mxfp4_scaled, mxfp8_quantize

__all__ = ["moe_gate_up", "moe_down", "moe_experts", "sort_by_expert", "moe_gate_up_mxfp4", "moe_down_mxfp4",
           "moe_experts_mxfp4", "moe_gate_up_mxfp4_scaled", "moe_down_mxfp4_scaled", "moe_experts_mxfp4_scaled",
           "mxfp8_quantize"]
