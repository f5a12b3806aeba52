"""The chunked (WY/UT) form shared by the delta-rule family: KDA, gated delta rule, delta rule,
and (without the WY transform) linear attention.

The computation is three pieces, each callable on its own (a compiler pass rewrites one
recurrent op into exactly these, and every backend lowers them separately):

  (a) `chunk_delta_prepare` / `chunk_linear_prepare`: intra-chunk work, parallel over chunks.
      Pads T to a multiple of C, cumulative gates G, the masked decayed scores, the WY/UT
      transform A = (I + L)^-1 diag(beta) by forward substitution, W = A (exp(G) k), U = A v,
      and the masked Aqk.
  (b) `chunk_state_scan`: the only sequential part, a loop over the NC = ceil(T / C) chunks.
  (c) `chunk_output`: O = scale ((q exp(G)) S_start + Aqk Vn), parallel over chunks, unpadded.

Inputs use fla's layout ([B, T, H, K], state [B, H, K, V]); between the pieces tensors are in
chunk layout [B, H, NC, C, ...], so every chunk product is one batched matmul. All fp32, or
all fp64 for fp64 inputs (the float64 yardstick).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

Tensor = torch.Tensor

# The chunk size of every chunked prefill unless a user picks another: the chunk-delta-rule
# pass's default and the eager models' prefill. 64 is fla's choice: C x C scores and the
# C-step forward substitution stay small while T/C, the serial part, stays short.
DEFAULT_CHUNK_SIZE = 64


def eager_chunk_size(T: int) -> int | None:
    """The eager prefill runs chunked (it equals the recurrent definition; tests), a single
    step runs the recurrence."""
    return DEFAULT_CHUNK_SIZE if T > 1 else None


class DeltaChunks(NamedTuple):
    """What piece (a) hands to the scan (b) and the output (c); chunk layout [B, H, NC, C, ...]."""

    q_decayed: Tensor  # [B, H, NC, C, K]  q * exp(G)
    k_decayed: Tensor  # [B, H, NC, C, K]  k * exp(G_last - G): a key's weight in the chunk's state
    w: Tensor | None  # [B, H, NC, C, K]  A (exp(G) * k); None: no delta correction (linear attn)
    u: Tensor  # [B, H, NC, C, V]  A v
    aqk: Tensor  # [B, H, NC, C, C]  sum_d q_i k_j exp(G_i - G_j) for j <= i, else 0
    decay_last: Tensor | None  # [B, H, NC, K] or [B, H, NC, 1]  exp(G_last); None: no decay


# ---------------------------------------------------------------------------- layout


def compute_dtype(*xs: Tensor | None) -> torch.dtype:
    """fp64 when any input is fp64 (the float64 yardstick), else fp32."""
    return torch.float64 if any(x is not None and x.dtype == torch.float64 for x in xs) else torch.float32


def to_chunks(x: Tensor, chunk_size: int, dtype: torch.dtype | None = None) -> Tensor:
    """[B, T, H, ...] -> [B, H, NC, C, ...] in `dtype` (default: compute_dtype(x)), zero-padded
    in time to NC * C."""
    B, T, H = x.shape[:3]
    NC = -(-T // chunk_size)
    wide = dtype or compute_dtype(x)
    out = torch.empty(B, H, NC * chunk_size, *x.shape[3:], dtype=wide, device=x.device)
    out[:, :, :T] = x.transpose(1, 2)
    out[:, :, T:] = 0
    return out.view(B, H, NC, chunk_size, *x.shape[3:])


def from_chunks(x: Tensor, T: int) -> Tensor:
    """[B, H, NC, C, ...] -> [B, T, H, ...]: the inverse of `to_chunks`, padding dropped."""
    B, H, NC, C = x.shape[:4]
    return x.movedim(1, 3).reshape(B, NC * C, H, *x.shape[4:])[:, :T]


# ---------------------------------------------------------------- (a) intra-chunk

# A decay factor is exp(x) for its log x <= 0, floored only at the bottom of fp32's normal
# range (2^-126 = 1.2e-38): a state the recurrence erases keeps at most 1.2e-38 of itself, where
# the recurrence's own values turn subnormal and lose their digits. (An e^-30 floor kept 1e-13
# of it, 3.8e-5 of an output whose new writes are small.) The floor keeps exp and the products
# that follow off the CPU's slow paths for subnormal numbers (10 to 30 times slower); one
# clamp, which keeps NaN. Entries that must be exactly zero (j > i) are zeroed by a mask.
LOG_FLOOR = -87.0  # exp(-87) = 1.6e-38, just above 2^-126
TINY = 2.0**-126  # the smallest normal fp32: the floor of a product of decays


def decay_exp_(x: Tensor) -> Tensor:
    """exp(max(x, LOG_FLOOR)) in place, for log-decays x <= 0."""
    return x.clamp_(min=LOG_FLOOR).exp_()


def decay_exp(x: Tensor) -> Tensor:
    """exp(max(x, LOG_FLOOR)), for log-decays x <= 0."""
    return decay_exp_(x.clone())


def floor_tiny_(x: Tensor) -> Tensor:
    """A product of decays raised to TINY in place where it fell below (NaN kept)."""
    return x.clamp_(min=TINY)


def segment_sums(g: Tensor) -> Tensor:
    """[..., C, K] -> [..., C(i), C(j), K] float64: G_i - G_j = sum of g over (j, i] for j <= i
    (0 elsewhere). Taken in float64 from a float64 cumsum of fp32 gates, so the difference is
    exact to fp32 however large the cumulative sums are: in fp32, G_i - G_j after a strong decay
    earlier in the chunk (|G| ~ 1e3) cancels to an absolute error of ulp(|G|), 6e-5."""
    G = g.double().cumsum(-2)
    C = g.shape[-2]
    diff = G[..., :, None, :] - G[..., None, :, :]
    return diff.masked_fill_(~causal_mask(C, g.device)[:, :, None], 0.0)


def causal_mask(C: int, device: torch.device) -> Tensor:
    """[C, C] bool, True where column j may feed row i (j <= i)."""
    return torch.ones(C, C, dtype=torch.bool, device=device).tril()


def channel_decay_scores_pairwise(q: Tensor, k: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """The definition: with G = cumsum(g), x_i . (k_j * exp(G_i - G_j)), the pairwise exponent
    masked to -inf above the diagonal before the exp, so nothing overflows however strong the
    decay (exp(G_i) * exp(-G_j) would).

    q, k, g [..., C, K] -> (kk [..., C, C] for j < i, qk [..., C, C] for j <= i; 0 elsewhere).
    Costs C * C * K exps; `channel_decay_scores` gives the same with C * K.
    """
    C = g.shape[-2]
    diff = segment_sums(g).to(g.dtype)  # [..., C(i), C(j), K]
    decay = decay_exp_(diff.masked_fill_(~causal_mask(C, g.device)[:, :, None], float("-inf")))
    kj = decay * k[..., None, :, :]
    kk = (kj * k[..., :, None, :]).sum(-1).tril(-1)
    qk = (kj * q[..., :, None, :]).sum(-1).tril()
    return kk, qk


def _tree_levels(C: int) -> list[int]:
    """Half-block sizes of the binary split of a chunk, smallest first: 1, 2, 4, ... C/2 for a
    power of two (an odd factor of C stays as the leaf block size)."""
    halves, b = [], C
    while b % 2 == 0:
        b //= 2
        halves.append(b)
    return halves[::-1]


def _block_diagonal(x: Tensor, nb: int) -> Tensor:
    """A writable view [..., C/nb, C/nb, nb] of the nb diagonal blocks of x [..., C, C]."""
    C = x.shape[-1]
    return torch.diagonal(x.view(*x.shape[:-2], nb, C // nb, nb, C // nb), dim1=-4, dim2=-2)


def _leaf_decays_(q: Tensor, k: Tensor, g: Tensor, leaf: int):
    """Scores inside leaf blocks (pairwise) and each leaf's prefix / suffix decays; the prefix
    decays overwrite g."""
    *lead, C, K = g.shape
    nb = C // leaf
    kk, qk = g.new_zeros(*lead, C, C), g.new_zeros(*lead, C, C)
    if leaf == 1:  # exp(G_i - G_i) = 1: only q_i . k_i on the diagonal
        _block_diagonal(qk, nb)[..., 0, 0, :] = (q[..., None, :] @ k[..., :, None])[..., 0, 0]
        return kk, qk, decay_exp_(g), torch.ones_like(g)
    lkk, lqk = channel_decay_scores_pairwise(*(x.view(*lead, nb, leaf, K) for x in (q, k, g)))
    _block_diagonal(kk, nb).copy_(lkk.movedim(-3, -1))
    _block_diagonal(qk, nb).copy_(lqk.movedim(-3, -1))
    G = g.view(*lead, nb, leaf, K).double().cumsum(-2)  # fp64: the suffix is a difference
    suffix = decay_exp_((G[..., -1:, :] - G).to(g.dtype))
    g.copy_(G.view(g.shape))
    return kk, qk, decay_exp_(g), suffix.view(g.shape)


def channel_decay_scores(q: Tensor, k: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`channel_decay_scores_pairwise` by a binary split of the chunk, plus the decays that the
    scan and the output need: (kk, qk, exp(G) [..., C, K], exp(G_last - G) [..., C, K]).

    For a block [s, s + 2h) split at m = s + h, rows i >= m against columns j < m factor through
    the split: exp(G_i - G_j) = exp(G_i - G_{m-1}) * exp(G_{m-1} - G_j), a prefix decay of the
    second half times a suffix decay of the first half, both <= 1, so the block is one batched
    matmul and nothing can overflow. Blocks double from the leaves up; each level's prefix and
    suffix decays are the previous level's times one block total (again <= 1), so the only exps
    are those of g itself (C * K per chunk instead of C * C * K), and no decay is ever a
    difference of two cumulative sums (which would cancel after a strong decay). Odd leaf blocks
    (C not a power of two) are done pairwise. Decays are floored at TINY like `decay_exp`.
    """
    return channel_decay_scores_(q, k, g.clone())


def channel_decay_scores_(q: Tensor, k: Tensor, g: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`channel_decay_scores`, overwriting g with the exp(G) it returns."""
    *lead, C, K = g.shape
    n = math.prod(lead)
    halves = _tree_levels(C)
    kk, qk, prefix, suffix = _leaf_decays_(q, k, g, C >> len(halves))
    rows_buf, cols_buf = g.new_empty(n * C * K), g.new_empty(n * C * K // 2)
    blk_buf = g.new_empty(n * C * C // 2)
    for h in halves:
        nb = C // (2 * h)
        shape = (*lead, nb, 2, h, K)
        pre, suf = prefix.view(shape), suffix.view(shape)
        rows = rows_buf.view(shape)  # [k rows; q rows] of the second halves
        torch.mul(k.view(shape)[..., 1, :, :], pre[..., 1, :, :], out=rows[..., 0, :, :])
        torch.mul(q.view(shape)[..., 1, :, :], pre[..., 1, :, :], out=rows[..., 1, :, :])
        cols = torch.mul(k.view(shape)[..., 0, :, :], suf[..., 0, :, :],
                         out=cols_buf.view(*lead, nb, h, K))
        blk = torch.matmul(rows.view(*lead, nb, 2 * h, K), cols.transpose(-1, -2),
                           out=blk_buf[: n * C * h].view(*lead, nb, 2 * h, h)).movedim(-3, -1)
        _block_diagonal(kk, nb)[..., h:, :h, :] = blk[..., :h, :, :]
        _block_diagonal(qk, nb)[..., h:, :h, :] = blk[..., h:, :, :]
        # double the blocks: first-half suffixes and second-half prefixes span the other half
        floor_tiny_(suf[..., 0, :, :].mul_(pre[..., 1, -1:, :]))
        floor_tiny_(pre[..., 1, :, :].mul_(pre[..., 0, -1:, :]))
    return kk, qk, prefix, suffix


def all_finite(y: Tensor) -> bool:
    """No NaN or inf in y, by one sum (a NaN or an inf makes it non-finite; a finite sum that
    overflows only sends the caller down its careful path)."""
    return math.isfinite(float(y.sum()))


def causal_matmul(A: Tensor, x: Tensor) -> Tensor:
    """A @ x for A [..., C, C] lower-triangular (zero above the diagonal) and x [..., C, N] in
    time order, with rows before a non-finite row of x (or column of A) left finite, as the
    recurrence leaves them: a plain matmul multiplies the masked zeros by that NaN or inf
    (0 * NaN = NaN) and spreads it to earlier tokens. All-finite results (the usual case) cost
    one sum; otherwise the product is a sum over j <= i selected by `where`."""
    y = A @ x
    if all_finite(y):
        return y
    keep = causal_mask(A.shape[-1], A.device)[:, :, None]
    return torch.where(keep, A[..., :, :, None] * x[..., None, :, :], 0.0).sum(-2)


def _row_substitution_(L: Tensor) -> Tensor:
    """L <- (I + L)^-1 row by row: with N = (I + L)^-1 - I, N[i, :i] = -L[i, :i] - L[i, :i] N[:i, :i],
    written over row i of L once it is read."""
    C = L.shape[-1]
    for i in range(1, C):
        l_i = L[..., i : i + 1, :i]  # [..., 1, i]
        L[..., i, :i] = -(l_i + l_i @ L[..., :i, :i]).squeeze(-2)
    torch.diagonal(L, dim1=-2, dim2=-1).fill_(1.0)
    return L


def unit_lower_inverse(L: Tensor, block: int = 8) -> Tensor:
    """(I + L)^-1 for a strictly lower-triangular L [..., C, C], by forward substitution.

    First row by row inside the diagonal blocks of `block` rows (all blocks at once), then
    block row by block row: T[P, :P] = -T[P, P] L[P, :P] T[:P, :P] for T = (I + L)^-1, which
    is the same substitution with matrices for scalars. Never a general inverse.
    """
    return unit_lower_inverse_(L.tril(-1), block)


def unit_lower_inverse_(L: Tensor, block: int = 8) -> Tensor:
    """`unit_lower_inverse` written over L (whose upper triangle must be zero)."""
    C = L.shape[-1]
    if C <= block or C % block:
        return _row_substitution_(L)
    nb = C // block
    diag = _block_diagonal(L, nb)  # [..., block, block, nb]
    T_diag = _row_substitution_(diag.movedim(-1, -3).contiguous())  # [..., nb, block, block]
    diag.copy_(T_diag.movedim(-3, -1))
    for p in range(1, nb):
        rows, done = slice(p * block, (p + 1) * block), slice(0, p * block)
        L[..., rows, done] = -causal_matmul(T_diag[..., p, :, :], L[..., rows, done] @ L[..., done, done])
    return L


def _gates_per_channel(q: Tensor, k: Tensor, g: Tensor, C: int):
    kk, qk, eG, eG_rest = channel_decay_scores_(q, k, to_chunks(g, C))
    k_w = k * eG
    return kk, qk, q.mul_(eG), k_w, k.mul_(eG_rest), eG[..., -1, :]


def _gates_per_head(q: Tensor, k: Tensor, g: Tensor, C: int):
    # the cumulative gates in fp64: every decay below is a difference of them (see segment_sums)
    G = to_chunks(g, C).double().cumsum(-1)  # [B, H, NC, C]
    diff = G[..., :, None] - G[..., None, :]
    f = q.dtype
    decay = decay_exp_(diff.to(f).masked_fill_(~causal_mask(C, G.device), float("-inf")))
    kk = (k @ k.transpose(-1, -2) * decay).tril(-1)
    qk = (q @ k.transpose(-1, -2) * decay).tril()
    eG = decay_exp_(G.to(f))[..., None]
    G_last = G[..., -1:]
    k_w = k * eG
    rest = decay_exp_((G_last - G).to(f))[..., None]
    return kk, qk, q.mul_(eG), k_w, k.mul_(rest), decay_exp_(G_last.to(f))


def _no_gates(q: Tensor, k: Tensor, g: None, C: int):
    kk = (k @ k.transpose(-1, -2)).tril(-1)
    qk = (q @ k.transpose(-1, -2)).tril()
    return kk, qk, q, k, k, None


# the gate kinds with a WY transform (ir/ops/delta_family.py; "linear" has none: chunk_linear_prepare)
_GATES = {"channel": _gates_per_channel, "head": _gates_per_head, "none": _no_gates}


def chunk_delta_prepare(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor,
                        chunk_size: int, gate: str) -> DeltaChunks:
    """(a) Intra-chunk preparation for the delta rule, parallel over chunks.

    q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; g (log-decay, <= 0) per channel
    [B, T, H, K] (gate "channel": KDA), per head [B, T, H] ("head": gated delta rule) or
    None ("none": delta rule), the gate kind of the op's spec (ir/ops/delta_family.py).
    Per chunk, G = cumsum(g) and
        L   = beta_i sum_d k_i k_j exp(G_i - G_j)   (j < i)     A = (I + L)^-1 diag(beta)
        W   = A (exp(G) k),  U = A v,  Aqk = sum_d q_i k_j exp(G_i - G_j)   (j <= i)
    Returns `DeltaChunks` in chunk layout [B, H, NC, C, ...].
    """
    C = chunk_size
    wide = compute_dtype(q, k, v, g, beta)
    if gate not in _GATES:
        raise ValueError(f"chunk_delta_prepare: gate must be one of {', '.join(_GATES)}, got {gate!r}")
    if (g is None) != (gate == "none"):
        raise ValueError(f"chunk_delta_prepare: gate {gate!r} {'takes no' if gate == 'none' else 'needs a'} g")
    g = None if g is None else g.to(wide)
    q, k, v, beta = (to_chunks(x, C, wide) for x in (q, k, v, beta))
    kk, qk, q_dec, k_w, k_dec, decay_last = _GATES[gate](q, k, g, C)
    A = unit_lower_inverse_(kk.mul_(beta[..., None])).mul_(beta[..., None, :])
    return DeltaChunks(q_dec, k_dec, causal_matmul(A, k_w), causal_matmul(A, v), qk, decay_last)


def chunk_linear_prepare(q: Tensor, k: Tensor, v: Tensor, chunk_size: int) -> DeltaChunks:
    """(a) for linear attention: no WY transform (A = I, beta = 1, no delta correction).

    Returns `DeltaChunks` with w = None, decay_last = None, u = v in chunk layout and
    Aqk = q k^T masked to j <= i.
    """
    wide = compute_dtype(q, k, v)
    q, k, v = (to_chunks(x, chunk_size, wide) for x in (q, k, v))
    qk = (q @ k.transpose(-1, -2)).tril()
    return DeltaChunks(q, k, None, v, qk, None)


# ------------------------------------------------------------- (b) the state scan


def chunk_state_scan(w: Tensor | None, u: Tensor, k_decayed: Tensor, decay_last: Tensor | None,
                     initial_state: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(b) The inter-chunk scan, the only sequential part (NC steps).

    w, k_decayed [B, H, NC, C, K]; u [B, H, NC, C, V]; decay_last [B, H, NC, K or 1];
    initial_state [B, H, K, V] (None: zeros). Per chunk n:
        Vn = U - W S;   record S as the chunk's start state;
        S  = exp(G_last)[:, None] * S + (k * exp(G_last - G))^T Vn
    Returns (v_new [B, H, NC, C, V], start_states [B, H, NC, K, V], final state [B, H, K, V]).
    """
    B, H, NC, C, V = u.shape
    K = k_decayed.shape[-1]
    u_, kt = u.reshape(B * H, NC, C, V), k_decayed.reshape(B * H, NC, C, K).transpose(-1, -2)
    w_ = None if w is None else w.reshape(B * H, NC, C, K)
    d_ = None if decay_last is None else decay_last.reshape(B * H, NC, -1, 1)
    if initial_state is None:
        S = u.new_zeros(B * H, K, V)
    else:
        S = initial_state.to(u.dtype).reshape(B * H, K, V)
    v_new, starts = [], []
    for n in range(NC):
        starts.append(S)
        vn = u_[:, n] if w_ is None else torch.baddbmm(u_[:, n], w_[:, n], S, alpha=-1)
        v_new.append(vn)
        S = torch.baddbmm(S if d_ is None else S * d_[:, n], kt[:, n], vn)
    v_new = u if w_ is None else torch.stack(v_new, 1).view(B, H, NC, C, V)
    return v_new, torch.stack(starts, 1).view(B, H, NC, K, V), S.view(B, H, K, V)


# ----------------------------------------------------------------- (c) the output


def chunk_output(q_decayed: Tensor, aqk: Tensor, v_new: Tensor, start_states: Tensor,
                 scale: float, T: int) -> Tensor:
    """(c) O = scale ((q exp(G)) S_start + Aqk Vn), parallel over chunks.

    q_decayed [B, H, NC, C, K]; aqk [B, H, NC, C, C]; v_new [B, H, NC, C, V];
    start_states [B, H, NC, K, V]. Returns o [B, T, H, V] fp32 with the padding removed.
    """
    o = q_decayed @ start_states
    o.view(-1, *o.shape[-2:]).baddbmm_(aqk.reshape(-1, *aqk.shape[-2:]),
                                       v_new.reshape(-1, *v_new.shape[-2:]))
    if not all_finite(o):  # keep a NaN from reaching earlier tokens
        o = q_decayed @ start_states + causal_matmul(aqk, v_new)
    return scale * from_chunks(o, T)


def chunk_delta(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, *, gate: str,
                scale: float | None = None, initial_state: Tensor | None = None,
                chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[Tensor, Tensor]:
    """(a), (b), (c) in a row: (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32)."""
    T, K = q.shape[1], q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    p = chunk_delta_prepare(q, k, v, g, beta, chunk_size, gate)
    v_new, starts, S = chunk_state_scan(p.w, p.u, p.k_decayed, p.decay_last, initial_state)
    o = chunk_output(p.q_decayed, p.aqk, v_new, starts, scale, T)
    return o.to(v.dtype), S
