"""Routed experts in Triton (grouped.py): a grouped GEMM over tokens sorted by expert.
Reference: ../naive.py."""

from .grouped import moe_down, moe_experts, moe_gate_up, sort_by_expert

__all__ = ["moe_gate_up", "moe_down", "moe_experts", "sort_by_expert"]
