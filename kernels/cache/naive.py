"""The definitions of a fixed-capacity cache: its row write and attention over its valid rows.

A cache holds N rows per sequence, [B, N, ...]; `positions` (int64 [B]) counts the rows of
each sequence already cached, so sequences of one batch may be at different positions. T new
tokens of sequence b go to rows positions[b] .. positions[b] + T - 1, and new token t sees
the keys 0 .. positions[b] + t (itself included, once written): the causal mask with a
per-sequence offset. Rows past a sequence's position are never read, whatever they hold: they
are selected away (`where`), never multiplied by a zero weight (0 * NaN is NaN).
"""

from __future__ import annotations

import torch


def cache_write(cache: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """cache [B, N, ...], new [B, T, ...], positions int64 [B] -> a copy of cache with
    rows positions[b] + t (t < T) of sequence b replaced by new[b, t]."""
    B, T = new.shape[:2]
    out = cache.clone()
    rows = positions.long()[:, None] + torch.arange(T, device=cache.device)[None, :]  # [B, T]
    batch = torch.arange(B, device=cache.device)[:, None].expand(B, T)
    out[batch, rows] = new.to(cache.dtype)
    return out


def visible(positions: torch.Tensor, T: int, N: int) -> torch.Tensor:
    """[B, T, N] bool: key j is visible to new token t of sequence b when j <= positions[b] + t."""
    t = torch.arange(T, device=positions.device)
    j = torch.arange(N, device=positions.device)
    return j[None, None, :] <= positions.long()[:, None, None] + t[None, :, None]


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """q [B, T, H, D], k [B, N, G, D], v [B, N, G, Dv] (G key/value heads serve H query
    heads, H % G == 0), positions [B] -> o [B, T, H, Dv] in v's dtype; fp32 scores."""
    B, T, H, D = q.shape
    N, G = k.shape[1], k.shape[2]
    scale = D**-0.5 if scale is None else scale
    # rows past the last one written hold anything (unused capacity, an earlier sequence's
    # rows): selected to 0, as a softmax weight of 0 times a NaN row would still be NaN
    used = (torch.arange(N, device=k.device)[None, :] < positions.long()[:, None] + T)[:, :, None, None]
    k, v = torch.where(used, k, 0), torch.where(used, v, 0)
    k, v = k.repeat_interleave(H // G, dim=2), v.repeat_interleave(H // G, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) * scale
    scores = scores.masked_fill(~visible(positions, T, N)[:, None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("bhts,bshv->bthv", p, v.float()).to(v.dtype)


def mla_cached_attention(q: torch.Tensor, ckv: torch.Tensor, krope: torch.Tensor, w_kv_b: torch.Tensor,
                         positions: torch.Tensor, v_head_dim: int, scale: float | None = None) -> torch.Tensor:
    """MLA (NoPE) over a fixed-capacity latent cache, expanded: q [B, T, H, Dn + Dr],
    ckv [B, N, Dc], krope [B, N, Dr], w_kv_b [H * (Dn + Dv), Dc] -> o [B, T, H, Dv]."""
    B, N, _ = ckv.shape
    H, Dr = q.shape[2], krope.shape[-1]
    Dn = q.shape[-1] - Dr
    kv = (ckv @ w_kv_b.t()).view(B, N, H, Dn + v_head_dim)
    k_nope, v = kv.split([Dn, v_head_dim], dim=-1)
    k = torch.cat([k_nope, krope[:, :, None, :].expand(B, N, H, Dr)], dim=-1)
    return cached_attention(q, k, v, positions, scale)


def mla_cached_attention_absorbed(q: torch.Tensor, ckv: torch.Tensor, krope: torch.Tensor, w_uk: torch.Tensor,
                                  w_uv: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """The absorbed form over a fixed-capacity latent cache: w_uk [H, Dn, Dc], w_uv [H, Dv, Dc];
    scores = [q_nope W_UK | q_rope] . [ckv | krope], o = softmax(scores) ckv W_UV^T."""
    Dn = w_uk.shape[1]
    q_nope, q_rope = q.float().split([Dn, q.shape[-1] - Dn], dim=-1)
    q_abs = torch.cat([torch.einsum("bthn,hnc->bthc", q_nope, w_uk.float()), q_rope], dim=-1)
    k_abs = torch.cat([ckv, krope], dim=-1).float()[:, :, None, :]  # one key/value head
    o_lat = cached_attention(q_abs, k_abs, ckv.float()[:, :, None, :], positions, scale)
    return torch.einsum("bthc,hvc->bthv", o_lat, w_uv.float()).to(q.dtype)
