"""MLA over the latent cache, both forms, on the Triton flash-attention kernel (NoPE).

prefill (expanded): the latent is up-projected by one GEMM (torch), then every head attends
    with the two-part key [k_nope | k_rope], k_rope shared by all heads (head stride 0).
decode (absorbed): W_UK folds into the query (a batched GEMM), then all heads attend to ONE
    key/value head, the latent itself ([ckv | krope] keys, ckv values), and W_UV maps the
    result back per head. The cache is never expanded per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...attention.triton.flash import flash_attention


def mla_attention(q: torch.Tensor, ckv: torch.Tensor, krope: torch.Tensor, w_kv_b: torch.Tensor, v_head_dim: int,
                  scale: float) -> torch.Tensor:
    """The IR op `mla_attention`: q [B, T, H, Dn + Dr], ckv [B, S, Dc], krope [B, S, Dr],
    w_kv_b [H (Dn + Dv), Dc] -> o [B, T, H, Dv] in q's dtype."""
    B, S, Dc = ckv.shape
    H, Dr = q.shape[2], krope.shape[-1]
    Dn = q.shape[-1] - Dr
    kv = F.linear(ckv, w_kv_b).view(B, S, H, Dn + v_head_dim)  # the up-projection, through torch
    k_nope, v = kv[..., :Dn], kv[..., Dn:]
    q = q.contiguous()
    return flash_attention(q[..., :Dn], k_nope, v, scale, q2=q[..., Dn:], k2=krope.contiguous(), out_dtype=q.dtype)


def mla_attention_absorbed(q: torch.Tensor, ckv: torch.Tensor, krope: torch.Tensor, w_uk: torch.Tensor,
                           w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """The IR op `mla_attention_absorbed`: q [B, T, H, Dn + Dr], ckv [B, S, Dc],
    krope [B, S, Dr], w_uk [H, Dn, Dc], w_uv [H, Dv, Dc] -> o [B, T, H, Dv] in q's dtype."""
    Dn = w_uk.shape[1]
    # W_UK folded into q, summed in fp32, then in the cache's dtype: a 16-bit model's dots take
    # 16-bit operands on the tensor cores (and half the shared memory of fp32 ones)
    q_lat = torch.einsum("bthn,hnc->bthc", q[..., :Dn].float(), w_uk.float()).to(ckv.dtype)
    o_lat = flash_attention(q_lat, ckv.contiguous(), ckv.contiguous(), scale, q2=q[..., Dn:].contiguous(),
                            k2=krope.contiguous(), out_dtype=torch.float32)
    return torch.einsum("bthc,hvc->bthv", o_lat, w_uv.float()).to(q.dtype)
