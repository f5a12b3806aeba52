"""Causal softmax attention in Triton (flash.py), shared by GPT-2 and both forms of MLA.
Reference: ../naive.py."""

from .flash import causal_attention, flash_attention

__all__ = ["flash_attention", "causal_attention"]
