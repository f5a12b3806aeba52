"""Absorbed MLA over a fixed-capacity latent cache in Triton (decode and extend of a served
sequence): W_UK folds into the query (a batched GEMM), all H heads attend to the ONE latent
key/value head of each sequence's written rows with the split-K kernel of
kernels/attention/triton/decoding.py ([ckv | krope] keys, ckv values: views, no copy), and
W_UV maps the result back per head. Reference: kernels/cache/naive.py
(mla_cached_attention_absorbed).
"""

from __future__ import annotations

import torch

from ...attention.triton.decoding import cached_attention


def mla_attention_absorbed_cached(q: torch.Tensor, ckv: torch.Tensor, krope: torch.Tensor, w_uk: torch.Tensor,
                                  w_uv: torch.Tensor, positions: torch.Tensor, scale: float,
                                  splits: int | None = None) -> torch.Tensor:
    """The IR op `mla_attention_absorbed_cached`: q [B, T, H, Dn + Dr], ckv [B, N, Dc],
    krope [B, N, Dr], w_uk [H, Dn, Dc], w_uv [H, Dv, Dc], positions int64 [B] -> o [B, T, H, Dv]
    in q's dtype. The T new rows are in the cache already (cache_write before it)."""
    Dn = w_uk.shape[1]
    # W_UK folded into q in fp32, then in the cache's dtype (a 16-bit model's dots on 16-bit operands)
    q_lat = torch.einsum("bthn,hnc->bthc", q[..., :Dn].float(), w_uk.float()).to(ckv.dtype)
    latent = ckv[:, :, None, :]  # one key/value head for every query head
    o_lat = cached_attention(q_lat, latent, latent, positions, scale, q2=q[..., Dn:].contiguous(),
                             k2=krope[:, :, None, :], out_dtype=torch.float32, splits=splits)
    return torch.einsum("bthc,hvc->bthv", o_lat, w_uv.float()).to(q.dtype)
