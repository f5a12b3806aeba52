"""Row norms in Triton (rows.py): (gated) RMSNorm and l2norm. Reference: ../naive.py."""

from .rows import gated_rmsnorm, l2norm, rms_norm

__all__ = ["gated_rmsnorm", "rms_norm", "l2norm"]
