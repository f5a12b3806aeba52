"""Fixed-capacity caches (serving): the write of the new tokens' rows and attention over the
valid rows of each sequence.

A cache is [B, N, ...] at full capacity N; `positions` (i64 [B]) counts the rows each sequence
holds already, so one batch may hold sequences at different positions (ragged decode). The
models call these ops when they run with `max_context=N` (the frontend keeps each whole); the
fold-latent-moe pass absorbs `mla_attention_cached` in decode as it does `mla_attention`.

    cache_write(cache, new, positions)                      rows positions[b] + t <- new[b, t]
    causal_attention_cached(q, k, v, positions)             token t of b sees keys <= positions[b] + t
    mla_attention_cached(q, ckv, krope, w_kv_b, positions)  MLA over the latent cache, expanded
    mla_attention_absorbed_cached(q, ckv, krope, w_uk, w_uv, positions)   ... absorbed (decode)

Each carries a decomposition into standard ops (an O(N) masked form), so a backend without a
lowering of its own still runs it; the backends' own lowerings write in place and read only
the rows below each sequence's position.
"""

from __future__ import annotations

from ...kernels.cache.naive import cache_write, cached_attention, mla_cached_attention, mla_cached_attention_absorbed
from .. import dims as D
from ..types import TensorType
from .attention import causal_pairs
from .recurrent import _fmt, _same_dims
from .spec import attr, defop, expect

SCALE = attr("float", lo=0, lo_open=True)


def _check_positions(positions: TensorType, B) -> None:
    expect(positions.dtype == "i64" and positions.rank == 1 and D.equal(positions.shape[0], B), "positions",
           f"positions must be i64[{D.to_str(B)}] (the rows each sequence holds), got {positions}")


def _write_infer(cache: TensorType, new: TensorType, positions: TensorType) -> list[TensorType]:
    expect(cache.rank >= 2 and new.rank == cache.rank, "cache-shape",
           f"cache_write takes cache [B, N, ...] and new [B, T, ...] of one rank, got {cache} and {new}")
    expect(_same_dims((cache.shape[0],) + cache.shape[2:], (new.shape[0],) + new.shape[2:]), "cache-shape",
           f"new rows {new} must match the cache {cache} but for dim 1")
    expect(cache.dtype == new.dtype, "dtype", f"cache {cache.dtype} and new rows {new.dtype} differ")
    _check_positions(positions, cache.shape[0])
    return [cache]


# ------------------------------------------------------------------ decompositions


def _visible(b, positions: str, T, N) -> str:
    """bool [B, 1, T, N]: key j visible to new token t of sequence b (j <= positions[b] + t)."""
    B = b.type(positions).shape[0]
    j = b.op("reshape", [b.op("arange", [], end=N)], shape=[1, 1, 1, N])
    t = b.op("reshape", [b.op("arange", [], end=T)], shape=[1, 1, T, 1])
    last = b.op("add", [b.op("reshape", [positions], shape=[B, 1, 1, 1]), t])
    return b.op("less", [j, b.op("add", [last, b.const(1, "i64")])])


def _masked_softmax_attend(b, scores: str, v: str, positions: str, scale: float) -> str:
    """softmax(scores * scale, masked) @ v: scores [B, H, T, N], v [B, G, N, Dv] -> [B, H, T, Dv].

    The rows of v past the last one written (positions[b] + T) are selected to 0 first: unused
    capacity, or rows left by an earlier sequence of the slot, may hold anything, and a softmax
    weight of 0 times a NaN or inf row is NaN."""
    B, _, T, N = b.type(scores).shape
    scaled = b.op("mul", [scores, b.const(float(scale), b.type(scores).dtype)])
    masked = b.op("where", [_visible(b, positions, T, N), scaled, b.const(float("-inf"), b.type(scores).dtype)])
    j = b.op("reshape", [b.op("arange", [], end=N)], shape=[1, 1, N, 1])
    t_end = b.op("arange", [], start=D.normalize(T - 1), end=T)  # [T - 1]: T may be symbolic
    end = b.op("add", [b.op("reshape", [positions], shape=[B, 1, 1, 1]), b.op("add", [t_end, b.const(1, "i64")])])
    v_used = b.op("where", [b.op("less", [j, end]), v, b.const(0.0, b.type(v).dtype)])
    return b.op("matmul", [b.op("softmax", [masked], dim=-1), v_used])


def _write_decompose(b, cache, new, positions):
    B, N, *rest = b.type(cache).shape
    T = b.type(new).shape[1]
    ones = [1] * len(rest)
    rel = b.op("sub", [b.op("reshape", [b.op("arange", [], end=N)], shape=[1, N]),
                       b.op("reshape", [positions], shape=[B, 1])])  # [B, N]: row - positions[b]
    last = b.op("arange", [], start=D.normalize(T - 1), end=T)  # [T - 1]
    row = b.op("minimum", [b.op("maximum", [rel, b.const(0, "i64")]), last])
    inside = b.op("less", [b.op("abs", [b.op("sub", [rel, row])]), b.const(1, "i64")])  # 0 <= rel < T
    idx = b.op("expand", [b.op("reshape", [row], shape=[B, N, *ones])], shape=[B, N, *rest])
    src = b.op("gather", [new, idx], dim=1)
    return [b.op("where", [b.op("reshape", [inside], shape=[B, N, *ones]), src, cache])]


def _heads_first(b, x: str) -> str:
    return b.op("permute", [x], perm=[0, 2, 1, 3])


KEY_BLOCK = 1024  # cache rows a block of the decomposition scores at once (several tokens, static capacity)


def _attn_decompose(b, q, k, v, positions, *, scale):
    T, N = b.type(q).shape[1], b.type(k).shape[1]
    if T != 1 and isinstance(N, int) and N > KEY_BLOCK:  # an extend over a large cache: blocks of keys
        return [_heads_first(b, _blocked_attend(b, q, k, v, positions, scale))]
    scores = b.op("matmul", [_heads_first(b, q), b.op("permute", [k], perm=[0, 2, 3, 1])])
    return [_heads_first(b, _masked_softmax_attend(b, scores, _heads_first(b, v), positions, scale))]


def _blocked_attend(b, q, k, v, positions: str, scale: float) -> str:
    """softmax attention over the cache in blocks of KEY_BLOCK rows with a running max, sum and
    output (online softmax), so an extend of T tokens holds [T, KEY_BLOCK] scores at a time, not
    [T, N]: a chunked prefill's pieces then need memory by the piece. q [B, T, H, D], k
    [B, N, G, D], v [B, N, G, Dv] -> [B, H, T, Dv]. Key 0 is visible to every token, so the
    running max is finite after the first block; a masked key's weight is selected to 0, and
    a value row past the last one written is selected to 0 before it is multiplied."""
    B, T = b.type(q).shape[:2]
    N = b.type(k).shape[1]
    qh, dt = _heads_first(b, q), b.type(q).dtype
    pos = b.op("reshape", [positions], shape=[B, 1, 1, 1])
    one = b.const(1, "i64")
    seen = b.op("add", [b.op("add", [pos, b.op("reshape", [b.op("arange", [], end=T)], shape=[1, 1, T, 1])]),
                        one])  # keys below this one are visible to token t
    last = b.op("reshape", [b.op("arange", [], start=D.normalize(T - 1), end=T)], shape=[1, 1, 1, 1])
    written = b.op("add", [b.op("add", [pos, last]), one])  # rows below this one are written
    m = o = total = None
    for start in range(0, N, KEY_BLOCK):
        end = min(start + KEY_BLOCK, N)
        kb = b.op("slice", [k], dim=1, start=start, end=end)
        vb = _heads_first(b, b.op("slice", [v], dim=1, start=start, end=end))  # [B, G, n, Dv]
        j = b.op("arange", [], start=start, end=end)
        vis = b.op("less", [b.op("reshape", [j], shape=[1, 1, 1, end - start]), seen])
        s = b.op("mul", [b.op("matmul", [qh, b.op("permute", [kb], perm=[0, 2, 3, 1])]), b.const(float(scale), dt)])
        s = b.op("where", [vis, s, b.const(float("-inf"), dt)])
        m_new = b.op("reduce_max", [s], dims=[3], keepdim=True)
        if m is not None:
            m_new = b.op("maximum", [m, m_new])
        w = b.op("where", [vis, b.op("exp", [b.op("sub", [s, m_new])]), b.const(0.0, dt)])
        used = b.op("less", [b.op("reshape", [j], shape=[1, 1, end - start, 1]), written])
        o_blk = b.op("matmul", [w, b.op("where", [used, vb, b.const(0.0, dt)])])
        s_blk = b.op("reduce_sum", [w], dims=[3], keepdim=True)
        if m is None:
            o, total = o_blk, s_blk
        else:
            r = b.op("exp", [b.op("sub", [m, m_new])])
            o = b.op("add", [b.op("mul", [o, r]), o_blk])
            total = b.op("add", [b.op("mul", [total, r]), s_blk])
        m = m_new
    return b.op("div", [o, total])


def _mla_decompose(b, q, ckv, krope, w_kv_b, positions, *, v_head_dim, scale):
    B, T, H, Dq = b.type(q).shape
    N, Dr = b.type(ckv).shape[1], b.type(krope).shape[2]
    Dn = D.normalize(Dq - Dr)
    kv = b.op("reshape", [b.op("linear", [ckv, w_kv_b])], shape=[B, N, H, Dn + v_head_dim])
    k_nope, v = b.op("split", [kv], dim=3, sizes=[Dn, v_head_dim])
    k_rope = b.op("expand", [b.op("reshape", [krope], shape=[B, N, 1, Dr])], shape=[B, N, H, Dr])
    k = b.op("concat", [k_nope, k_rope], dim=3)
    return [b.op("causal_attention_cached", [q, k, v, positions], scale=scale)]


def _absorbed_decompose(b, q, ckv, krope, w_uk, w_uv, positions, *, scale):
    """The scores as cache @ queries ([B, N, Dc] @ [B, Dc, H T]): no transpose of the cache,
    only of the [B, N, H T] scores, which are H T / (Dc + Dr) of its size."""
    B, T, H, Dq = b.type(q).shape
    N, Dc, Dr = b.type(ckv).shape[1], b.type(ckv).shape[2], b.type(krope).shape[2]
    HT = D.normalize(H * T)
    q_nope, q_rope = b.op("split", [q], dim=3, sizes=[D.normalize(Dq - Dr), Dr])
    q_lat = b.op("matmul", [_heads_first(b, q_nope), w_uk])  # [B, H, T, Dc]
    cols = lambda x, d: b.op("reshape", [b.op("permute", [x], perm=[0, 3, 1, 2])], shape=[B, d, HT])  # noqa: E731
    s_nt = b.op("add", [b.op("matmul", [ckv, cols(q_lat, Dc)]),
                        b.op("matmul", [krope, cols(_heads_first(b, q_rope), Dr)])])  # [B, N, H T]
    scores = b.op("reshape", [b.op("permute", [s_nt], perm=[0, 2, 1])], shape=[B, H, T, N])
    o_lat = _masked_softmax_attend(b, scores, b.op("reshape", [ckv], shape=[B, 1, N, Dc]), positions, scale)
    o = b.op("matmul", [o_lat, b.op("permute", [w_uv], perm=[0, 2, 1])])  # [B, H, T, Dv]
    return [_heads_first(b, o)]


# ------------------------------------------------------------------ declarations


def _attn_infer(q, k, v, positions, *, scale) -> list[TensorType]:
    expect(q.rank == 4 and k.rank == 4 and v.rank == 4, "qkv-shape",
           f"causal_attention_cached takes q [B, T, H, D] and k, v [B, N, G, *]; got {q}, {k}, {v}")
    B, T, H, Dq = q.shape
    expect(_same_dims((k.shape[0], k.shape[3]), (B, Dq)) and isinstance(k.shape[2], int)
           and isinstance(H, int) and H % k.shape[2] == 0, "qkv-shape",
           f"k must be [B, N, G, D] with G dividing q's heads, q {q}, got {k}")
    expect(_same_dims(v.shape[:3], k.shape[:3]), "qkv-shape", f"v must be [B, N, G, Dv] matching k {k}, got {v}")
    _check_positions(positions, B)
    return [v.with_shape((B, T, H, v.shape[3]))]


def _attn_flops(ins, outs, a):
    B, T, H, Dq = ins[0]
    return causal_pairs(T, ins[1][1]) * B * H * (2 * Dq + 2 * ins[2][3] + 4)


def _mla_infer(q, ckv, krope, w_kv_b, positions, *, v_head_dim, scale) -> list[TensorType]:
    expect(q.rank == 4 and ckv.rank == 3 and krope.rank == 3, "mla-shape",
           f"q must be [B, T, H, nope + rope], ckv [B, N, Dc], krope [B, N, Dr]; got {q}, {ckv}, {krope}")
    B, T, H, Dq = q.shape
    expect(_same_dims(krope.shape[:2], ckv.shape[:2]) and D.equal(ckv.shape[0], B), "mla-shape",
           f"krope {krope} must match ckv {ckv} in B and N")
    Dn = D.normalize(Dq - krope.shape[2])
    expected = (D.normalize(H * (Dn + v_head_dim)), ckv.shape[2])
    expect(_same_dims(w_kv_b.shape, expected), "mla-shape", f"w_kv_b must be {_fmt(expected)}, got {w_kv_b}")
    _check_positions(positions, B)
    return [q.with_shape((B, T, H, v_head_dim))]


def _mla_flops(ins, outs, a):
    B, T, H, Dq = ins[0]
    N, Dc, Dr = ins[1][1], ins[1][2], ins[2][2]
    Dv = a["v_head_dim"]
    return 2 * B * N * Dc * H * (Dq - Dr + Dv) + causal_pairs(T, N) * B * H * (2 * Dq + 2 * Dv + 4)


def _absorbed_infer(q, ckv, krope, w_uk, w_uv, positions, *, scale) -> list[TensorType]:
    expect(q.rank == 4 and ckv.rank == 3 and krope.rank == 3, "mla-shape",
           f"q must be [B, T, H, nope + rope], ckv [B, N, Dc], krope [B, N, Dr]; got {q}, {ckv}, {krope}")
    B, T, H, Dq = q.shape
    Dc, Dr = ckv.shape[2], krope.shape[2]
    expect(_same_dims(krope.shape[:2], ckv.shape[:2]) and D.equal(ckv.shape[0], B), "mla-shape",
           f"krope {krope} must match ckv {ckv} in B and N")
    expect(_same_dims(w_uk.shape, (H, D.normalize(Dq - Dr), Dc)), "mla-shape",
           f"w_uk must be {_fmt((H, D.normalize(Dq - Dr), Dc))}, got {w_uk}")
    expect(w_uv.rank == 3 and _same_dims((w_uv.shape[0], w_uv.shape[2]), (H, Dc)), "mla-shape",
           f"w_uv must be [H, Dv, Dc] with H = {D.to_str(H)}, Dc = {D.to_str(Dc)}, got {w_uv}")
    _check_positions(positions, B)
    return [q.with_shape((B, T, H, w_uv.shape[1]))]


def _absorbed_flops(ins, outs, a):
    B, T, H, Dq = ins[0]
    N, Dc, Dr = ins[1][1], ins[1][2], ins[2][2]
    Dn, Dv = ins[3][1], ins[4][1]
    return 2 * B * T * H * Dc * (Dn + Dv) + causal_pairs(T, N) * B * H * (2 * (Dc + Dr) + 2 * Dc + 4)


defop("cache_write", "cache new positions", "cache_out", infer=_write_infer, ref=cache_write, eager=True,
      decompose=_write_decompose, flops=lambda ins, outs, a: 0, families="cache",
      doc="the cache with rows positions[b] + t of sequence b replaced by new[b, t] (in place on the backends)")
defop("causal_attention_cached", "q k v positions", "o", attrs={"scale": SCALE}, infer=_attn_infer,
      ref=lambda q, k, v, positions, scale: cached_attention(q, k, v, positions, scale), eager=True,
      decompose=_attn_decompose, flops=_attn_flops, families="attention cache",
      doc="softmax attention over a fixed-capacity cache: token t of sequence b sees keys <= positions[b] + t")
defop("mla_attention_cached", "q ckv krope w_kv_b positions", "o",
      attrs={"v_head_dim": attr("int", lo=1), "scale": SCALE}, infer=_mla_infer,
      ref=lambda q, ckv, krope, w, positions, v_head_dim, scale: mla_cached_attention(q, ckv, krope, w, positions,
                                                                                      v_head_dim, scale),
      eager=True, decompose=_mla_decompose, flops=_mla_flops, families="attention cache",
      doc="MLA over a fixed-capacity latent cache (keys/values up-projected), masked per sequence")
defop("mla_attention_absorbed_cached", "q ckv krope w_uk w_uv positions", "o", attrs={"scale": SCALE},
      infer=_absorbed_infer, ref=mla_cached_attention_absorbed, decompose=_absorbed_decompose,
      flops=_absorbed_flops, families="attention cache",
      doc="absorbed MLA over a fixed-capacity latent cache: one key/value head [ckv | krope], W_UV after")

