"""MLA attention in Triton (latent.py): the expanded prefill form and the absorbed decode
form, both on kernels/attention/triton's flash kernel. Reference: ../naive.py."""

from .latent import mla_attention, mla_attention_absorbed

__all__ = ["mla_attention", "mla_attention_absorbed"]
