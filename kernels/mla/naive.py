"""The definition of MLA attention over a latent cache (NoPE), expanded and absorbed.

q [B, T, H, Dn + Dr] (nope part first), ckv [B, S, Dc] (normalised latent), krope [B, S, Dr]
(one rope-key shared by all heads), w_kv_b [H * (Dn + Dv), Dc] (kv_b_proj.weight). The S
cached positions end with the T new ones (causal, bottom-right aligned).
"""

from __future__ import annotations

import torch

from ..attention.naive import causal_attention


def mla_attention(
    q: torch.Tensor,
    ckv: torch.Tensor,
    krope: torch.Tensor,
    w_kv_b: torch.Tensor,
    v_head_dim: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Expanded form: up-project the latent to per-head keys and values, then attend."""
    B, S, _ = ckv.shape
    H, Dr = q.shape[2], krope.shape[-1]
    Dn = q.shape[-1] - Dr
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    kv = (ckv @ w_kv_b.t()).view(B, S, H, Dn + v_head_dim)
    k_nope, v = kv.split([Dn, v_head_dim], dim=-1)
    k = torch.cat([k_nope, krope[:, :, None, :].expand(B, S, H, Dr)], dim=-1)
    return causal_attention(q, k, v, scale)


def mla_attention_absorbed(
    q: torch.Tensor,
    ckv: torch.Tensor,
    krope: torch.Tensor,
    w_kv_b: torch.Tensor,
    v_head_dim: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Absorbed form (the decode path): W_UK folds into the query, W_UV after attention.

    scores = [q_nope W_UK | q_rope] . [ckv | krope];  o = softmax(scores) ckv W_UV^T.
    One key/value head of width Dc + Dr is shared by all H query heads.
    """
    B, S, Dc = ckv.shape
    H, Dr = q.shape[2], krope.shape[-1]
    Dn = q.shape[-1] - Dr
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    w = w_kv_b.view(H, Dn + v_head_dim, Dc)
    w_uk, w_uv = w[:, :Dn], w[:, Dn:]
    q_nope, q_rope = q.float().split([Dn, Dr], dim=-1)
    q_lat = torch.einsum("bthn,hnc->bthc", q_nope, w_uk.float())
    q_abs = torch.cat([q_lat, q_rope], dim=-1)  # [B, T, H, Dc + Dr]
    k_abs = torch.cat([ckv, krope], dim=-1).float()[:, :, None, :]  # [B, S, 1, Dc + Dr]
    o_lat = causal_attention(q_abs, k_abs.expand(B, S, H, Dc + Dr),
                             ckv.float()[:, :, None, :].expand(B, S, H, Dc), scale)
    return torch.einsum("bthc,hvc->bthv", o_lat, w_uv.float()).to(q.dtype)
