"""The AttnRes mixing kernel (mix.py). Reference: ../naive.py."""

from .mix import attn_res_mix

__all__ = ["attn_res_mix"]
