"""Bodies of the chunked delta rule: `chunk_prepare_{channel,head,none,linear}`,
`chunk_state_scan` and `chunk_output` (the IR's chunk_prepare / chunk_state_scan /
chunk_output, k3c.kernels.delta_chunk in ONNX).

Between the pieces tensors are in chunk layout [B, H, NC, C, ...] with NC = ceil(T / C)
computed at run time, so one artifact serves every T. The WY/UT transform
A = (I + L)^-1 diag(beta) is a forward substitution (a Loop over the C rows), never a
general inverse; pairwise decays exp(G_i - G_j) are masked before the exp.
"""

from __future__ import annotations

from ..builder import INT64_MAX, Builder, loop_counter, subgraph
from . import function

EXP_FLOOR = -30.0  # as k3c.kernels.delta_chunk: exp(max(x, -30)) for log-decays x <= 0


def decay_exp(b: Builder, x: str) -> str:
    return b.Exp(b.Max(x, b.const(EXP_FLOOR)))


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


def unit_lower_inverse(b: Builder, L: str, C: str) -> str:
    """(I + L)^-1 for a strictly lower-triangular L [B, H, NC, C, C], by forward substitution:
    row i of N = inverse - I is -(L[i] + L[i] N), a Loop over the C rows."""
    s = Builder("subst")
    it, cnd = loop_counter(s)
    i, cond, N = it[0], cnd[0], s.fresh("N")
    l_i = s.Gather(L, i, axis=-2)  # [..., C]
    r = s.Neg(s.Add(l_i, s.squeeze(s.MatMul(s.unsqueeze(l_i, -2), N), -2)))
    rows = s.Range(s.const(0, "i64"), s.squeeze(C, 0), s.const(1, "i64"))
    onehot = s.unsqueeze(s.Cast(s.Equal(rows, i), to=1), -1)  # [C, 1]
    N_next = s.Add(N, s.Mul(onehot, s.unsqueeze(r, -2)))
    cond_out = s.Identity(cond)
    body = subgraph(s, "forward_substitution", [it, cnd, (N, "f32", 5)], [(cond_out, "bool", []), (N_next, "f32", 5)])
    N0 = b.Mul(L, b.const(0.0))
    N = b.op("Loop", [b.squeeze(C, 0), b.const(True, "bool"), N0], 1, body=body)
    eye = b.EyeLike(b.ConstantOfShape(b.Concat(C, C, axis=0)), dtype=1)
    return b.Add(N, eye)


def _last(b: Builder, G: str, axis: int) -> str:
    return b.Slice(G, b.ints([-1]), b.ints([INT64_MAX]), b.ints([axis]))


def _channel_gates(b: Builder, q: str, k: str, g: str, C: str):
    """Per-channel decays: masked pairwise exp(G_i - G_j), the definition (no overflow)."""
    G = b.CumSum(g, b.const(-2, "i64"))  # [B, H, NC, C, K]
    diff = b.Sub(b.unsqueeze(G, -2), b.unsqueeze(G, -3))  # [..., C(i), C(j), K]
    allowed = b.unsqueeze(causal_mask(b, C), -1)
    decay = decay_exp(b, b.Where(allowed, diff, b.const(EXP_FLOOR)))
    kj = b.Mul(decay, b.unsqueeze(k, -3))
    kk = b.ReduceSum(b.Mul(kj, b.unsqueeze(k, -2)), b.ints([-1]), keepdims=0)
    qk = b.ReduceSum(b.Mul(kj, b.unsqueeze(q, -2)), b.ints([-1]), keepdims=0)
    eG = decay_exp(b, G)
    G_last = _last(b, G, -2)  # [..., 1, K]
    k_decayed = b.Mul(k, decay_exp(b, b.Sub(G_last, G)))
    decay_last = b.squeeze(decay_exp(b, G_last), -2)  # [B, H, NC, K]
    return kk, qk, b.Mul(q, eG), b.Mul(k, eG), k_decayed, decay_last


def _head_gates(b: Builder, q: str, k: str, g: str, C: str):
    """One decay per head: the pairwise exp(G_i - G_j) is [C, C], scores are matmuls."""
    G = b.CumSum(g, b.const(-1, "i64"))  # [B, H, NC, C]
    diff = b.Sub(b.unsqueeze(G, -1), b.unsqueeze(G, -2))
    decay = decay_exp(b, b.Where(causal_mask(b, C), diff, b.const(EXP_FLOOR)))
    kt = b.Transpose(k, perm=[0, 1, 2, 4, 3])
    kk = b.Mul(b.MatMul(k, kt), decay)
    qk = b.Mul(b.MatMul(q, kt), decay)
    eG = b.unsqueeze(decay_exp(b, G), -1)
    G_last = _last(b, G, -1)  # [B, H, NC, 1]
    k_decayed = b.Mul(k, b.unsqueeze(decay_exp(b, b.Sub(G_last, G)), -1))
    return kk, qk, b.Mul(q, eG), b.Mul(k, eG), k_decayed, decay_exp(b, G_last)


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
    A = b.Mul(unit_lower_inverse(b, L, C), b.unsqueeze(bc, -2))
    return q_dec, k_dec, b.MatMul(A, k_w), b.MatMul(A, vc), b.Trilu(qk, upper=0), decay_last


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


@function("chunk_state_scan", "w u k_decayed decay_last state", "v_new start_states state_out")
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
    o = b.Add(b.MatMul(q_decayed, start_states), b.MatMul(aqk, v_new))
    return b.Mul(b.param(scale), from_chunks(b, o, length))
