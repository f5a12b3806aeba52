"""Bodies of the recurrent ops: `kda`, `gated_delta_rule`, `delta_rule`, `linear_attention`
as the token-by-token definition (a Scan over T, any T, the decode path), and their
`*_chunked` forms (the chunk pieces of chunked.py in a row, for prefill).

Per token, with S [B, H, K, V] fp32 (the k3c.kernels naive references):
    S = exp(g_t) S                         (kda: per channel, gated: per head, delta: none)
    S = S + beta_t k_t (v_t - k_t^T S)^T
    o_t = scale q_t^T S
linear attention: S += k_t v_t^T, z += k_t, o_t = (q_t^T S) / (q_t^T z).
"""

from __future__ import annotations

from ..builder import Builder, subgraph
from . import function
from .chunked import chunk_output, chunk_prepare, chunk_state_scan


def _delta_step(gate: str, scale: str):
    """The Scan body of one token of the delta family: (S, q, k, v[, g], beta) -> (S', o);
    `scale` is a value of the enclosing graph."""
    s = Builder(f"{gate}_step")
    S, q, k, v = (s.fresh(n) for n in ("S", "q", "k", "v"))
    g = s.fresh("g") if gate in ("channel", "head") else None
    beta = s.fresh("beta")
    S1 = S
    if gate == "channel":
        S1 = s.Mul(S, s.unsqueeze(s.Exp(g), -1))  # g_t [B, H, K]
    elif gate == "head":
        S1 = s.Mul(S, s.unsqueeze(s.Exp(g), -1, -2))  # g_t [B, H]
    v_old = s.MatMul(s.unsqueeze(k, 2), S1)  # [B, H, 1, V]
    u = s.Mul(s.unsqueeze(beta, 2, 3), s.Sub(s.unsqueeze(v, 2), v_old))
    S2 = s.Add(S1, s.MatMul(s.unsqueeze(k, 3), u))
    o = s.Mul(scale, s.squeeze(s.MatMul(s.unsqueeze(q, 2), S2), 2))
    g_rank = 3 if gate == "channel" else 2
    ins = [(S, "f32", 4), (q, "f32", 3), (k, "f32", 3), (v, "f32", 3)] + ([(g, "f32", g_rank)] if g else [])
    return s, ins + [(beta, "f32", 2)], [(S2, "f32", 4), (o, "f32", 3)]


def delta_scan(b: Builder, q, k, v, g, beta, state, scale, gate: str) -> list[str]:
    """Scan the delta rule over T (axis 1): returns (o [B, T, H, V], final state)."""
    s, ins, outs = _delta_step(gate, b.param(scale))
    body = subgraph(s, f"{gate}_delta_step", ins, outs)
    xs = [q, k, v] + ([g] if g is not None else []) + [beta]
    ranks = [4, 4, 4] + ([4 if gate == "channel" else 3] if g is not None else []) + [3]
    S, o = b.op("Scan", [state, *(time_major(b, x, r) for x, r in zip(xs, ranks))], 2, body=body,
                num_scan_inputs=len(xs))
    return [time_major(b, o, 4), S]


def time_major(b: Builder, x: str, rank: int) -> str:
    """[B, T, ...] <-> [T, B, ...]: Scan runs over axis 0, the axis every runtime scans."""
    return b.Transpose(x, perm=[1, 0] + list(range(2, rank)))


@function("kda", "q k v g beta state", "o state_out", {"scale": "float"})
def kda(b, q, k, v, g, beta, state, scale):
    """KDA by its recurrence (Scan over T): per-channel decay g [B, T, H, K]."""
    return delta_scan(b, q, k, v, g, beta, state, scale, "channel")


@function("gated_delta_rule", "q k v g beta state", "o state_out", {"scale": "float"})
def gated_delta_rule(b, q, k, v, g, beta, state, scale):
    """The gated delta rule by its recurrence (Scan over T): one decay per head g [B, T, H]."""
    return delta_scan(b, q, k, v, g, beta, state, scale, "head")


@function("delta_rule", "q k v beta state", "o state_out", {"scale": "float"})
def delta_rule(b, q, k, v, beta, state, scale):
    """The delta rule by its recurrence (Scan over T): no decay."""
    return delta_scan(b, q, k, v, None, beta, state, scale, "none")


@function("linear_attention", "q k v state z", "o state_out z_out", {"scale": "float"})
def linear_attention(b, q, k, v, state, z, scale):
    """Normalised linear attention by its recurrence (Scan over T)."""
    s = Builder("linear_step")
    S, zz, qt, kt, vt = (s.fresh(n) for n in ("S", "z", "q", "k", "v"))
    S2 = s.Add(S, s.MatMul(s.unsqueeze(kt, 3), s.unsqueeze(vt, 2)))
    z2 = s.Add(zz, kt)
    qs = s.Mul(b.param(scale), qt)
    num = s.squeeze(s.MatMul(s.unsqueeze(qs, 2), S2), 2)  # [B, H, V]
    den = s.ReduceSum(s.Mul(qs, z2), s.ints([-1]), keepdims=1)  # [B, H, 1]
    o = s.Div(num, den)
    body = subgraph(s, "linear_attention_step", [(S, "f32", 4), (zz, "f32", 3), (qt, "f32", 3), (kt, "f32", 3),
                                                  (vt, "f32", 3)], [(S2, "f32", 4), (z2, "f32", 3), (o, "f32", 3)])
    xs = [time_major(b, x, 4) for x in (q, k, v)]
    S_out, z_out, o_all = b.op("Scan", [state, z, *xs], 3, body=body, num_scan_inputs=3)
    return time_major(b, o_all, 4), S_out, z_out


# ---- chunked forms: prepare -> state scan -> output, any T (padded inside) ---------------

def delta_chunked(b: Builder, q, k, v, g, beta, state, scale, chunk_size, gate: str) -> list[str]:
    T = b.shape_of(q, 1)
    q_dec, k_dec, w, u, aqk, decay_last = chunk_prepare(b, q, k, v, beta, g, chunk_size, gate)
    v_new, starts, S = chunk_state_scan(b, w, u, k_dec, decay_last, state)
    return [chunk_output(b, q_dec, aqk, v_new, starts, T, scale), S]


_CHUNK_ATTRS = {"scale": "float", "chunk_size": "int"}


@function("kda_chunked", "q k v g beta state", "o state_out", _CHUNK_ATTRS)
def kda_chunked(b, q, k, v, g, beta, state, scale, chunk_size):
    """KDA in the chunked WY/UT form (same result as `kda`), for prefill."""
    return delta_chunked(b, q, k, v, g, beta, state, scale, chunk_size, "channel")


@function("gated_delta_rule_chunked", "q k v g beta state", "o state_out", _CHUNK_ATTRS)
def gated_delta_rule_chunked(b, q, k, v, g, beta, state, scale, chunk_size):
    """The gated delta rule in chunked form (same result as `gated_delta_rule`)."""
    return delta_chunked(b, q, k, v, g, beta, state, scale, chunk_size, "head")


@function("delta_rule_chunked", "q k v beta state", "o state_out", _CHUNK_ATTRS)
def delta_rule_chunked(b, q, k, v, beta, state, scale, chunk_size):
    """The delta rule in chunked form (same result as `delta_rule`)."""
    return delta_chunked(b, q, k, v, None, beta, state, scale, chunk_size, "none")


@function("linear_attention_chunked", "q k v state z", "o state_out z_out", _CHUNK_ATTRS)
def linear_attention_chunked(b, q, k, v, state, z, scale, chunk_size):
    """Linear attention in chunked form: z rides as an all-ones value column of the state."""
    T = b.shape_of(q, 1)
    ones = b.Expand(b.const(1.0), b.Concat(b.Shape(v, end=3), b.ints([1]), axis=0))
    v1 = b.Concat(v, ones, axis=-1)  # [B, T, H, V + 1]
    S1 = b.Concat(state, b.unsqueeze(z, -1), axis=-1)  # [B, H, K, V + 1]
    q_dec, k_dec, w, u, aqk, decay_last = chunk_prepare(b, q, k, v1, None, None, chunk_size, "linear")
    v_new, starts, S1_out = chunk_state_scan(b, w, u, k_dec, decay_last, S1)
    o1 = chunk_output(b, q_dec, aqk, v_new, starts, T, scale)
    V = b.shape_of(v, -1)
    o = b.Div(b.Slice(o1, b.ints([0]), V, b.ints([-1])), b.Slice(o1, V, b.ints([2**62]), b.ints([-1])))
    S_out = b.Slice(S1_out, b.ints([0]), V, b.ints([-1]))
    z_out = b.squeeze(b.Slice(S1_out, V, b.ints([2**62]), b.ints([-1])), -1)
    return o, S_out, z_out
