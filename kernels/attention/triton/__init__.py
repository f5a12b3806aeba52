"""Causal softmax attention in Triton (flash.py), shared by GPT-2 and both forms of MLA,
and attention over a fixed-capacity cache split over the keys (decoding.py). References:
../naive.py, ../../cache/naive.py."""

from .decoding import cached_attention, causal_attention_cached
from .flash import causal_attention, flash_attention

__all__ = ["flash_attention", "causal_attention", "cached_attention", "causal_attention_cached"]
