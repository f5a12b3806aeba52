"""MLA's absorbed attention by the split-key latent kernels (k3c.kernels.cache): the queries
taken into the latent space, each split of a sequence's valid rows scored and summed by one
block (blocks of keys in vectors on llvm, kernels/cache/tvm_blocked.py), the splits merged,
W_UV applied. Each cache row is read once and in place, with no transposed copy of the cache.

It serves a fixed cache (`mla_attention_absorbed_cached`, cache_ops.py) and, on llvm, a
decode step over a growing cache (`mla_attention_absorbed`, kernel_ops.py), whose one new row
is the last of the N the step holds: positions N - 1.
"""

from __future__ import annotations

from tvm import relax

from ...kernels.cache import tvm as K
from ...kernels.cache.tvm_blocked import latent_split_blocked
from .context import LowerContext

R = relax.op


def into_latent(ctx: LowerContext, q, w_uk, B, L, H: int, Dn: int, Dc: int) -> relax.Expr:
    """q [B, L, H, Dn + Dr] -> [q_nope W_UK | q_rope] [B, L, H, Dc + Dr]: the queries against
    the one latent key head [ckv | krope]."""
    q_nope, q_rope = (relax.TupleGetItem(ctx.bb.emit(R.split(q, [Dn], axis=3)), i) for i in range(2))
    q_heads = R.permute_dims(R.reshape(q_nope, relax.ShapeExpr([B * L, H, Dn])), [1, 0, 2])  # [H, BL, Dn]
    q_lat = R.permute_dims(R.matmul(q_heads, w_uk), [1, 0, 2])  # [BL, H, Dc]
    return ctx.bb.emit(R.concat([R.reshape(q_lat, relax.ShapeExpr([B, L, H, Dc])), q_rope], axis=3))


def out_of_latent(o_lat, w_uv, B, L, H: int, Dc: int, Dv: int) -> relax.Expr:
    """o_lat [B, L, H, Dc] -> o_lat W_UV^T [B, L, H, Dv]."""
    o_heads = R.permute_dims(R.reshape(o_lat, relax.ShapeExpr([B * L, H, Dc])), [1, 0, 2])  # [H, BL, Dc]
    o = R.matmul(o_heads, R.permute_dims(w_uv, [0, 2, 1]))  # [H, BL, Dv]
    return R.reshape(R.permute_dims(o, [1, 0, 2]), relax.ShapeExpr([B, L, H, Dv]))


def latent_attention(ctx: LowerContext, q, ckv, krope, w_uk, w_uv, positions, B, L, H: int, Dn: int, Dv: int,
                     Dc: int, Dr: int, N: int | None, scale: float) -> relax.Expr:
    """q [B, L, H, Dn + Dr], ckv [B, N, Dc], krope [B, N, Dr], w_uk [H, Dn, Dc], w_uv
    [H, Dv, Dc], positions int64 [B] -> o [B, L, H, Dv]; N None (a dynamic row count) on llvm."""
    q_abs = into_latent(ctx, q, w_uk, B, L, H, Dn, Dc)
    if ctx.target == "llvm":  # blocks of keys in vectors, written out for the CPU (no schedule)
        split = ctx.kernel(("latent_split_blocked", H, Dc, Dr, scale),
                           lambda: latent_split_blocked(H, Dc, Dr, scale, K.SPLITS))
    else:
        split = ctx.kernel(("latent_split", H, Dc, Dr, N, scale),
                           lambda: K.latent_split(H, Dc, Dr, N, scale, ctx.target), K.SPLIT_SCHEDULES)
    merge = ctx.kernel(("latent_merge", H, Dc), lambda: K.latent_merge(H, Dc, ctx.target), K.MERGE_SCHEDULES)
    S = K.SPLITS
    parts = [relax.TensorType([B, L, S, H, Dc], "float32"), relax.TensorType([B, L, S, H, 2], "float32")]
    acc, st = ctx.call_tir(split, [q_abs, ckv, krope, positions], parts)
    (o_lat,) = ctx.call_tir(merge, [acc, st], [relax.TensorType([B, L, H, Dc], "float32")])
    return out_of_latent(o_lat, w_uv, B, L, H, Dc, Dv)


def last_rows(ctx: LowerContext, krope, Dr: int, B) -> relax.Expr:
    """int64 [B] holding N - 1 for krope [B, N, Dr]: a growing cache's decode step, whose new
    row is its last (an opaque kernel: Relax ops shaped by a symbolic N alone, such as
    `shape_to_tensor` or `ones`, take N as a PrimValue, and FuseTIR fails on them fused, TVM 0.27)."""
    gv = ctx.kernel(("last_positions", Dr), lambda: K.last_positions(Dr))
    return ctx.call_tir(gv, [krope], [relax.TensorType([B], "int64")])[0]
