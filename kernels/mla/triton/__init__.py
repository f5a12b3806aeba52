"""MLA attention in Triton (latent.py): the expanded prefill form and the absorbed decode
form, both on kernels/attention/triton's flash kernel; the absorbed form over a
fixed-capacity cache (cached.py) on its split-K kernel. References: ../naive.py,
../../cache/naive.py."""

from .cached import mla_attention_absorbed_cached
from .latent import mla_attention, mla_attention_absorbed

__all__ = ["mla_attention", "mla_attention_absorbed", "mla_attention_absorbed_cached"]
