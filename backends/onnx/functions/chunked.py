"""Bodies of the chunked delta rule: `chunk_prepare_{channel,head,none,linear}`,
`chunk_state_scan` and `chunk_output` (the IR's chunk_prepare / chunk_state_scan /
chunk_output, k3c.kernels.delta.chunk in ONNX).

Between the pieces tensors are in chunk layout [B, H, NC, C, ...] with NC = ceil(T / C)
computed at run time, so one artifact serves every T. The WY/UT transform
A = (I + L)^-1 diag(beta) is a recursive block substitution (a Loop over the log2 C
levels), never a general inverse; pairwise decays exp(G_i - G_j) have exponents <= 0 and are
taken from fp64 cumulative gates, so they stay exact after a strong decay.
"""

from __future__ import annotations

from ..builder import INT64_MAX, Builder, loop_counter, subgraph
from . import function, op_function

F32, F64 = 1, 11  # ONNX TensorProto element types
LOG_FLOOR = -87.0  # as k3c.kernels.delta.chunk: decays floored at e^-87, the bottom of fp32's normal range


def decay_exp(b: Builder, x: str) -> str:
    """exp(max(x, LOG_FLOOR)) for a log-decay x <= 0."""
    return b.Exp(b.Max(x, b.const(LOG_FLOOR)))


def masked_decay_exp(b: Builder, visible: str, x: str) -> str:
    """exp(x) where `visible` (a bool mask broadcast against x), exp(LOG_FLOOR) elsewhere: the
    mask as an additive -inf bias on its own small shape, then decay_exp's floor. The same
    values as a Where(visible, x, LOG_FLOOR) over x's shape, which onnxruntime broadcasts
    slowly (a fifth of a KDA layer's chunk_prepare in its profiler)."""
    bias = b.Where(visible, b.const(0.0), b.const(float("-inf")))
    return decay_exp(b, b.Add(x, bias))


def narrow(b: Builder, x64: str) -> str:
    """A float64 log-decay (a difference of fp64 cumulative gates) as fp32."""
    return b.Cast(x64, to=F32)


def low_part(b: Builder, G64: str, hi: str) -> str:
    """G - hi in fp32, for hi = max(fp32(G), LOG_FLOOR) (an op between the two Casts, so that
    onnxruntime does not take the fp64 -> fp32 -> fp64 chain for a no-op); |lo| <= ulp(G) / 2
    where hi is not floored."""
    return b.Cast(b.Sub(G64, b.Cast(hi, to=F64)), to=F32)


def suffix_decay_exp(b: Builder, g: str, axis: int) -> str:
    """exp(G_last - G) as exp of the sum of the gates after each row (an exclusive reverse
    cumsum), never the difference of two cumulative sums."""
    return decay_exp(b, b.CumSum(g, b.const(axis, "i64"), exclusive=1, reverse=1))


def cumulative_gates(b: Builder, g: str, axis: int) -> str:
    """G = cumsum(g) over the chunk, in fp64. Every decay between two tokens is a difference of
    these; in fp32, after a strong decay earlier in the chunk (|G| ~ 1e3), that difference
    cancels to an absolute error of ulp(|G|) (6e-5), while fp64 keeps it exact to fp32."""
    return b.CumSum(b.Cast(g, to=F64), b.const(axis, "i64"))


def to_chunks(b: Builder, x: str, C: str, rank: int) -> str:
    """[B, T, H, ...] (of `rank` dims) -> [B, H, NC, C, ...], zero-padded in time to NC * C.
    C: int64 [1]."""
    T = b.shape_of(x, 1)
    NC = b.Div(b.Sub(b.Add(T, C), b.ints([1])), C)
    pad = b.Sub(b.Mul(NC, C), T)
    pads = b.Concat(b.ints([0] * (rank + 1)), pad, b.ints([0] * (rank - 2)), axis=0)
    shape = b.Concat(b.shape_of(x, 0), NC, C, b.Shape(x, start=2), axis=0)
    chunks = b.Reshape(b.Pad(x, pads), shape)
    return b.Transpose(chunks, perm=[0, 3, 1, 2] + list(range(4, rank + 1)))


def from_chunks(b: Builder, x: str, T: str) -> str:
    """[B, H, NC, C, V] -> [B, T, H, V]: the inverse of `to_chunks`, padding dropped."""
    seq = b.Transpose(x, perm=[0, 2, 3, 1, 4])  # [B, NC, C, H, V]
    flat = b.Reshape(seq, b.Concat(b.ints([0, -1]), b.Shape(seq, start=3), axis=0))
    return b.Slice(flat, b.ints([0]), T, b.ints([1]))


def causal_mask(b: Builder, C: str, strict: bool = False) -> str:
    """bool [C, C]: True where column j may feed row i (j <= i; j < i when strict)."""
    r = b.Range(b.const(0, "i64"), b.squeeze(C, 0), b.const(1, "i64"))
    i, j = b.unsqueeze(r, 1), b.unsqueeze(r, 0)
    return b.Less(j, i) if strict else b.Not(b.Greater(j, i))


def causal_matmul(b: Builder, A: str, x: str, C: str) -> str:
    """A @ x for A [.., C, C] lower-triangular (zero above the diagonal) and x [.., C, N] in time
    order (rank 5), with rows before a non-finite row of x (or column of A) left finite, as the
    recurrence leaves them: a MatMul multiplies the zeros above the diagonal by that NaN or inf
    (0 * NaN = NaN) and spreads it to earlier tokens of the chunk. All-finite products (the
    usual case) cost one ReduceSum; otherwise an If takes the sum over j <= i selected by Where
    (k3c.kernels.delta.chunk.causal_matmul, in ONNX)."""
    y = b.MatMul(A, x)
    finite = _finite(b, y)
    t = Builder("finite_product")
    plain = subgraph(t, "causal_product", [], [(t.Identity(y), "f32", 5)])
    e = Builder("selected_product")
    terms = e.Mul(e.unsqueeze(A, -1), e.unsqueeze(x, -3))  # [.., C(i), C(j), N]
    kept = e.Where(e.unsqueeze(causal_mask(e, C), -1), terms, e.const(0.0))
    selected = subgraph(e, "causal_product_selected", [], [(e.ReduceSum(kept, e.ints([-2]), keepdims=0), "f32", 5)])
    return b.op("If", [finite], 1, then_branch=plain, else_branch=selected)


def _finite(b: Builder, x: str) -> str:
    """bool scalar: no NaN or inf in x, by one sum."""
    total = b.ReduceSum(x, keepdims=0)
    return b.Not(b.Or(b.IsNaN(total), b.IsInf(total)))


def nan_local_inverse(b: Builder, L: str, C: str) -> str:
    """unit_lower_inverse(L) with a non-finite entry of L kept to its row and the rows after it,
    where the recurrence puts it: the blocked products of the inverse multiply the zeros above
    a block's diagonal by it and would spread it to earlier rows. All-finite L (the usual case)
    costs one ReduceSum; otherwise the inverse of L with those entries zeroed, NaN from the
    first row that held one."""
    finite = _finite(b, L)
    t = Builder("finite_lower")
    e = Builder("zeroed_lower")
    zeroed = e.Where(e.Or(e.IsNaN(L), e.IsInf(L)), e.const(0.0), L)
    used = b.op("If", [finite], 1, then_branch=subgraph(t, "finite_lower", [], [(t.Identity(L), "f32", 5)]),
                else_branch=subgraph(e, "zeroed_lower", [], [(zeroed, "f32", 5)]))
    inv = unit_lower_inverse(b, used, C)
    t = Builder("finite_inverse")
    e = Builder("poisoned_inverse")
    bad = e.ReduceMax(e.Cast(e.Or(e.IsNaN(L), e.IsInf(L)), to=F32), e.ints([-1]), keepdims=1)  # [.., C, 1]
    after = e.Greater(e.CumSum(bad, e.const(-2, "i64")), e.const(0.0))  # rows from the first bad one on
    poisoned = e.Where(after, e.const(float("nan")), inv)
    return b.op("If", [finite], 1, then_branch=subgraph(t, "finite_inverse", [], [(t.Identity(inv), "f32", 5)]),
                else_branch=subgraph(e, "poisoned_inverse", [], [(poisoned, "f32", 5)]))


PAIR_BLOCK = 8  # rows per block of the pairwise in-block decays (when it divides C)


def unit_lower_inverse(b: Builder, L: str, C: str) -> str:
    """(I + L)^-1 for a strictly lower-triangular L [B, H, NC, C, C] by recursive blocking:
    the inverses of the diagonal blocks of w rows give those of 2w rows,
    [[T11, 0], [T21, T22]] with T21 = -T22 L21 T11, from w = 1 (all blocks of a level at
    once, a Loop of log2 P levels for C padded to the power of two P). The same algebra as
    the blocked forward substitution of k3c.kernels.delta.chunk, in log2 C steps instead of
    C rows; never a general inverse."""
    one = b.ints([1])
    lead = b.Shape(L, end=3)  # [B, H, NC]
    levels = b.Cast(b.Ceil(b.Sub(b.Div(b.Log(b.Cast(C, to=1)), b.const(0.6931471805599453)), b.const(1e-4))), to=7)
    P = b.Cast(b.Pow(b.const(2.0), b.Cast(levels, to=1)), to=7)  # [1]
    pad = b.Sub(P, C)
    flat = b.Reshape(b.Pad(L, b.Concat(b.ints([0] * 8), pad, pad, axis=0)), b.Concat(lead, b.Mul(P, P), axis=0))

    s = Builder("merge_blocks")
    it, cnd = loop_counter(s)
    D = s.fresh("D")  # [.., n, w, w]: the inverses of the n diagonal blocks of w rows
    w = s.Shape(D, start=-1)
    h = s.Div(s.Shape(D, start=-3, end=-2), s.ints([2]))  # blocks of the next level

    def rng(m):
        return s.Range(s.const(0, "i64"), s.squeeze(m, 0), s.const(1, "i64"))

    T11, T22 = (s.squeeze(x, -3) for x in s.Split(s.Reshape(D, s.Concat(lead, h, s.ints([2]), w, w, axis=0)),
                                                    outputs=2, axis=-3, num_outputs=2))  # [.., h, w, w]
    base = s.Mul(s.Mul(s.unsqueeze(rng(h), 1, 2), s.ints([2])), w)  # 2 j w, [h, 1, 1]
    rows = s.Add(s.Add(base, w), s.unsqueeze(rng(w), 0, 2))  # (2j + 1) w + a
    L21 = s.Gather(flat, s.Add(s.Mul(rows, P), s.Add(base, s.unsqueeze(rng(w), 0, 1))), axis=3)  # [.., h, w, w]
    T21 = s.Neg(s.MatMul(T22, s.MatMul(L21, T11)))
    D_next = s.Concat(s.Concat(T11, s.Mul(T11, s.const(0.0)), axis=-1), s.Concat(T21, T22, axis=-1), axis=-2)
    cond_out = s.Identity(cnd[0])
    body = subgraph(s, "merge_diagonal_blocks", [it, cnd, (D, "f32", 6)], [(cond_out, "bool", []),
                                                                             (D_next, "f32", 6)])
    D0 = b.Expand(b.const(1.0), b.Concat(lead, P, one, one, axis=0))  # blocks of one row: 1
    D = b.op("Loop", [b.squeeze(levels, 0), b.const(True, "bool"), D0], 1, body=body)  # [.., 1, P, P]
    return b.Slice(b.Reshape(D, b.Concat(lead, P, P, axis=0)), b.ints([0, 0]), b.Concat(C, C, axis=0),
                   b.ints([-2, -1]))


def _last(b: Builder, G: str, axis: int) -> str:
    return b.Slice(G, b.ints([-1]), b.ints([INT64_MAX]), b.ints([axis]))


def _blocks(b: Builder, C: str, size: int) -> tuple[str, str]:
    """(block size, block count): blocks of `size` rows when it divides C, else one block of C."""
    bs = b.Where(b.Equal(b.Mod(C, b.ints([size])), b.ints([0])), b.ints([size]), C)
    return bs, b.Div(C, bs)


def _block_diagonal(b: Builder, x: str, NB: str, C: str, lead: str) -> str:
    """[.., NB, c, c] diagonal blocks -> [.., NB, c, C] rows with the blocks in place."""
    eye = b.EyeLike(b.ConstantOfShape(b.Concat(NB, NB, axis=0)), dtype=1)  # [NB, NB]
    spread = b.Mul(b.unsqueeze(x, -2), b.unsqueeze(eye, 1, 3))  # [.., NB, c, NB, c]
    return b.Reshape(spread, b.Concat(lead, NB, b.Shape(x, start=-2, end=-1), C, axis=0))


FACTOR_SPAN = 64.0  # largest decay span of a chunk scored as exp(G_i) exp(-G_j)


def _channel_gates(b: Builder, q: str, k: str, g: str, C: str):
    """Per-channel decays exp(G_i - G_j), j <= i, for the scores kk and qk, as an If on the
    largest decay of any chunk, max(-G_last) (G the gates' cumsum from the chunk's start, fp64):

    - below FACTOR_SPAN, each score is one matmul of factored decays, (k_i exp(G_i)) .
      (k_j exp(-G_j)): every factor lies in [e^-64, e^64] (no overflow, no subnormals in fp32)
      and, with G split into fp32 hi + lo (`low_part`), each is good to an ulp, so each term of
      the dot product is the pairwise one to a few ulps;
    - above it, `_blocked_channel_scores`, whose exponents are never above 0."""
    G = cumulative_gates(b, g, -2)  # [B, H, NC, C, K] fp64
    hi = b.Max(narrow(b, G), b.const(LOG_FLOOR))
    span = b.ReduceMax(b.Neg(_last(b, hi, -2)), keepdims=0)  # the strongest decay of a chunk, >= 0
    eG = b.Exp(hi)  # exp(G) alone errs by |G| e^G u <= u / e: no low part needed
    # factored, G >= -64: exp(G_i) exp(-G_j) as exp(hi_i) (1 + lo_i) exp(-hi_j) (1 - lo_j), each
    # factor good to an ulp; exp(hi_i) exp(-hi_j) alone would err by ulp(64) = 8e-6
    f = Builder("factored")
    lo = low_part(f, G, hi)
    k_t = f.Transpose(f.Mul(f.Mul(k, f.Exp(f.Neg(hi))), f.Sub(f.const(1.0), lo)), perm=[0, 1, 2, 4, 3])  # [.., K, C]
    eG_f = f.Mul(eG, f.Add(f.const(1.0), lo))
    kk_f, qk_f = f.MatMul(f.Mul(k, eG_f), k_t), f.MatMul(f.Mul(q, eG_f), k_t)
    factored = subgraph(f, "factored_decay_scores", [], [(kk_f, "f32", 5), (qk_f, "f32", 5)])
    p = Builder("pairwise")
    kk_p, qk_p = _blocked_channel_scores(p, q, k, G, C)
    pairwise = subgraph(p, "pairwise_decay_scores", [], [(kk_p, "f32", 5), (qk_p, "f32", 5)])
    kk, qk = b.op("If", [b.Less(span, b.const(FACTOR_SPAN))], 2, then_branch=factored, else_branch=pairwise)
    k_decayed = b.Mul(k, suffix_decay_exp(b, g, -2))
    decay_last = b.squeeze(_last(b, eG, -2), -2)  # [B, H, NC, K]
    return kk, qk, b.Mul(q, eG), b.Mul(k, eG), k_decayed, decay_last


def _blocked_channel_scores(b: Builder, q: str, k: str, G: str, C: str):
    """kk and qk with per-channel decays exp(G_i - G_j), j <= i, with no exponent above 0 (no
    overflow however strong the decay), each exponent a difference of fp64 cumulative gates G
    rounded once to fp32 (exact after a strong decay). In blocks of c rows (as the reference's binary split,
    one level): pairs in one block are pairwise (clipped to exponents <= 0 before the exp); a
    pair with j in an earlier block goes through the block's first row r:
    exp(G_i - G_r) exp(G_r - G_j), both factors <= 1, so those scores are matmuls. Memory
    C c K per chunk instead of C^2 K."""
    lead = b.Shape(G, end=3)
    c, NB = _blocks(b, C, PAIR_BLOCK)
    K = b.Shape(G, start=-1)
    blocked = b.Concat(lead, NB, c, K, axis=0)
    Gb, qb, kb = (b.Reshape(x, blocked) for x in (G, q, k))  # [.., NB, c, K]
    # pairs inside a block: pairwise. G_i - G_j <= 0 for j <= i (a cumsum of gates <= 0 never
    # grows, in floats too); the pairs j > i are clipped to exp(0) = 1, kept finite, and dropped
    # by the Trilus of chunk_prepare, so no mask is needed on the [.., c, c, K] tensors
    diff = b.Sub(b.unsqueeze(Gb, -2), b.unsqueeze(Gb, -3))  # [.., NB, c(i), c(j), K]
    kj = b.Mul(b.Exp(b.Clip(narrow(b, diff), b.const(LOG_FLOOR), b.const(0.0))), b.unsqueeze(kb, -3))
    # both scores as one batched matrix-vector product per row i: kj[i] [c, K] @ [k_i q_i] [K, 2]
    kq = b.Concat(b.unsqueeze(kb, -1), b.unsqueeze(qb, -1), axis=-1)  # [.., NB, c, K, 2]
    kk_in, qk_in = b.Split(b.MatMul(kj, kq), outputs=2, axis=-1, num_outputs=2)  # [.., NB, c, c, 1] each
    kk_in, qk_in = b.squeeze(kk_in, -1), b.squeeze(qk_in, -1)
    # pairs across blocks, through the block's first row r
    G_r = b.Slice(Gb, b.ints([0]), b.ints([1]), b.ints([-2]))  # [.., NB, 1, K]
    rows = decay_exp(b, narrow(b, b.Sub(Gb, G_r)))  # exp(G_i - G_r)
    starts = b.unsqueeze(b.Mul(b.Range(b.const(0, "i64"), b.squeeze(NB, 0), b.const(1, "i64")), b.squeeze(c, 0)), 1)
    cols = b.Range(b.const(0, "i64"), b.squeeze(C, 0), b.const(1, "i64"))
    earlier = b.Less(cols, starts)  # [NB, C]: column j is in a block before the row's
    to_r = narrow(b, b.Sub(G_r, b.unsqueeze(G, -3)))  # G_r - G_j, [.., NB, C, K]
    k_cols = b.Mul(masked_decay_exp(b, b.unsqueeze(earlier, -1), to_r), b.unsqueeze(k, -3))
    k_cols_t = b.Transpose(k_cols, perm=[0, 1, 2, 3, 5, 4])  # [.., NB, K, C]
    mask = b.unsqueeze(b.Cast(earlier, to=1), 1)  # [NB, 1, C]
    kk_x = b.Mul(b.MatMul(b.Mul(kb, rows), k_cols_t), mask)  # [.., NB, c, C]
    qk_x = b.Mul(b.MatMul(b.Mul(qb, rows), k_cols_t), mask)
    square = b.Concat(lead, C, C, axis=0)
    kk = b.Reshape(b.Add(kk_x, _block_diagonal(b, kk_in, NB, C, lead)), square)
    qk = b.Reshape(b.Add(qk_x, _block_diagonal(b, qk_in, NB, C, lead)), square)
    return kk, qk


def _head_gates(b: Builder, q: str, k: str, g: str, C: str):
    """One decay per head: the pairwise exp(G_i - G_j) is [C, C], scores are matmuls; G in fp64
    as for the channel gates."""
    G = cumulative_gates(b, g, -1)  # [B, H, NC, C]
    diff = narrow(b, b.Sub(b.unsqueeze(G, -1), b.unsqueeze(G, -2)))
    decay = masked_decay_exp(b, causal_mask(b, C), diff)
    kt = b.Transpose(k, perm=[0, 1, 2, 4, 3])
    kk = b.Mul(b.MatMul(k, kt), decay)
    qk = b.Mul(b.MatMul(q, kt), decay)
    eG = decay_exp(b, narrow(b, G))  # [B, H, NC, C]; errs by |G| e^G u <= u / e
    k_decayed = b.Mul(k, b.unsqueeze(suffix_decay_exp(b, g, -1), -1))
    return kk, qk, b.Mul(q, b.unsqueeze(eG, -1)), b.Mul(k, b.unsqueeze(eG, -1)), k_decayed, _last(b, eG, -1)


def _no_gates(b: Builder, q: str, k: str):
    kt = b.Transpose(k, perm=[0, 1, 2, 4, 3])
    ones = b.Expand(b.const(1.0), b.Concat(b.Shape(k, end=3), b.ints([1]), axis=0))  # [B, H, NC, 1]
    return b.MatMul(k, kt), b.MatMul(q, kt), q, k, k, ones


def chunk_prepare(b: Builder, q, k, v, beta, g, chunk_size, gate: str):
    """The intra-chunk work shared by the four gate kinds (see module docstring)."""
    C = b.Reshape(b.param(chunk_size, "i64"), b.ints([1]))
    qc, kc, vc = (to_chunks(b, x, C, 4) for x in (q, k, v))
    if gate == "linear":
        kk, qk, q_dec, k_w, k_dec, decay_last = _no_gates(b, qc, kc)
        aqk = b.Trilu(qk, upper=0)
        return q_dec, k_dec, b.Mul(kc, b.const(0.0)), vc, aqk, decay_last
    if gate == "channel":
        kk, qk, q_dec, k_w, k_dec, decay_last = _channel_gates(b, qc, kc, to_chunks(b, g, C, 4), C)
    elif gate == "head":
        kk, qk, q_dec, k_w, k_dec, decay_last = _head_gates(b, qc, kc, to_chunks(b, g, C, 3), C)
    else:
        kk, qk, q_dec, k_w, k_dec, decay_last = _no_gates(b, qc, kc)
    bc = to_chunks(b, beta, C, 3)  # [B, H, NC, C]
    L = b.Mul(b.unsqueeze(bc, -1), b.Trilu(kk, b.const(-1, "i64"), upper=0))
    A = b.Mul(nan_local_inverse(b, L, C), b.unsqueeze(bc, -2))
    return q_dec, k_dec, causal_matmul(b, A, k_w, C), causal_matmul(b, A, vc, C), b.Trilu(qk, upper=0), decay_last


_PREPARE_OUT = "q_decayed k_decayed w u aqk decay_last"


@function("chunk_prepare_channel", "q k v beta g", _PREPARE_OUT, {"chunk_size": "int"})
def _prepare_channel(b, q, k, v, beta, g, chunk_size):
    """chunk_prepare with a per-channel gate g [B, T, H, K] (KDA)."""
    return chunk_prepare(b, q, k, v, beta, g, chunk_size, "channel")


@function("chunk_prepare_head", "q k v beta g", _PREPARE_OUT, {"chunk_size": "int"})
def _prepare_head(b, q, k, v, beta, g, chunk_size):
    """chunk_prepare with one gate per head g [B, T, H] (gated delta rule)."""
    return chunk_prepare(b, q, k, v, beta, g, chunk_size, "head")


@function("chunk_prepare_none", "q k v beta", _PREPARE_OUT, {"chunk_size": "int"})
def _prepare_none(b, q, k, v, beta, chunk_size):
    """chunk_prepare without decay (delta rule)."""
    return chunk_prepare(b, q, k, v, beta, None, chunk_size, "none")


@function("chunk_prepare_linear", "q k v", _PREPARE_OUT, {"chunk_size": "int"})
def _prepare_linear(b, q, k, v, chunk_size):
    """chunk_prepare of linear attention: A = I, w = 0, no beta and no decay."""
    return chunk_prepare(b, q, k, v, None, None, chunk_size, "linear")


@op_function("chunk_state_scan")
def chunk_state_scan(b: Builder, w, u, k_decayed, decay_last, state):
    """The inter-chunk scan (a Scan over NC): v_new = u - w S; start = S;
    S = decay_last * S + k_decayed^T v_new."""
    s = Builder("chunk_step")
    S, w_n, u_n, k_n, d_n = (s.fresh(n) for n in ("S", "w", "u", "k", "d"))
    start = s.Identity(S)
    vn = s.Sub(u_n, s.MatMul(w_n, S))
    S_next = s.Add(s.Mul(S, s.unsqueeze(d_n, -1)), s.MatMul(s.Transpose(k_n, perm=[0, 1, 3, 2]), vn))
    body = subgraph(s, "chunk_state_step", [(S, "f32", 4), (w_n, "f32", 4), (u_n, "f32", 4), (k_n, "f32", 4),
                                             (d_n, "f32", 3)], [(S_next, "f32", 4), (vn, "f32", 4), (start, "f32", 4)])
    # Scan runs over axis 0 (the axis every runtime scans): NC goes first and comes back
    xs = [b.Transpose(x, perm=[2, 0, 1] + list(range(3, r))) for x, r in
          ((w, 5), (u, 5), (k_decayed, 5), (decay_last, 4))]
    S_out, v_new, starts = b.op("Scan", [state, *xs], 3, body=body, num_scan_inputs=4)
    back = [1, 2, 0, 3, 4]
    return b.Transpose(v_new, perm=back), b.Transpose(starts, perm=back), S_out


@function("chunk_output", "q_decayed aqk v_new start_states length", "o", {"scale": "float"})
def chunk_output(b: Builder, q_decayed, aqk, v_new, start_states, length, scale):
    """o = scale ((q exp G) S_start + aqk v_new), unpadded to `length` (int64 [1], the T)."""
    C = b.Shape(aqk, start=-1)
    o = b.Add(b.MatMul(q_decayed, start_states), causal_matmul(b, aqk, v_new, C))
    return b.Mul(b.param(scale), from_chunks(b, o, length))
