"""The (gated) RMSNorm Triton kernel (rows.py). Reference: ../naive.py."""

from .rows import gated_rmsnorm, rms_norm

__all__ = ["gated_rmsnorm", "rms_norm"]
