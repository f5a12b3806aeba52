"""The chunked delta rule as three IR ops, the split of fla's kernels (intra / state / output).

The chunk-delta-rule pass rewrites a recurrent `kda`, `gated_delta_rule`, `delta_rule` or
`linear_attention` of a prefill graph into

    chunk_prepare  (parallel over chunks)  q, k, v, beta[, g] -> q_decayed, k_decayed, w, u, aqk, decay_last
    chunk_state_scan (NC = ceil(T / C) sequential steps)   -> v_new, start_states, final state
    chunk_output   (parallel over chunks)                  -> o [B, T, H, V]

Between them tensors are in chunk layout [B, H, NC, C, ...], fp32. References: k3c.kernels.delta.chunk.
"""

from __future__ import annotations

import sympy
import torch

from ...kernels.delta import chunk as dc
from .. import dims as D
from ..types import TensorType
from .delta_family import GATE_KINDS, DeltaForm
from .recurrent import _fmt, _same_dims, check_qkv, check_state
from .spec import attr, defop, expect

GATES = GATE_KINDS  # the `gate` attribute: the gate kind of the op the pass chunked (delta_family.py)


def num_chunks(T: D.Dim, C: int) -> D.Dim:
    return -(-T // C) if isinstance(T, int) else D.normalize(sympy.ceiling(sympy.sympify(T) / C))


def _prepare_infer(q, k, v, beta=None, g=None, *, chunk_size, gate) -> list[TensorType]:
    B, T, H, K, V = check_qkv(q, k, v)
    form = DeltaForm(gate)
    if form.beta:
        expect(beta is not None and _same_dims(beta.shape, (B, T, H)), "beta-shape",
               f"beta must be {_fmt((B, T, H))}, got {beta}")
    if form.decays:
        want = form.g_shape(B, T, H, K)
        expect(g is not None and _same_dims(g.shape, want), "gate-shape", f"g must be {_fmt(want)}, got {g}")
    else:
        expect(g is None, "arity", f"chunk_prepare with gate={gate!r} takes no g")
    C = chunk_size
    NC = num_chunks(T, C)
    f32 = "f32"
    kshape, vshape = (B, H, NC, C, K), (B, H, NC, C, V)
    return [TensorType(f32, kshape), TensorType(f32, kshape), TensorType(f32, kshape), TensorType(f32, vshape),
            TensorType(f32, (B, H, NC, C, C)), TensorType(f32, (B, H, NC, form.decay_width(K)))]


def _prepare_ref(q, k, v, beta=None, g=None, *, chunk_size, gate):
    if DeltaForm(gate).normaliser:
        p = dc.chunk_linear_prepare(q, k, v, chunk_size)
    else:
        p = dc.chunk_delta_prepare(q, k, v, g, beta, chunk_size, gate)
    B, H, NC, C, K = p.q_decayed.shape
    w = p.w if p.w is not None else torch.zeros_like(p.k_decayed)
    decay = p.decay_last if p.decay_last is not None else torch.ones(B, H, NC, 1)
    return p.q_decayed, p.k_decayed, w, p.u, p.aqk, decay.reshape(B, H, NC, -1)


def _prepare_flops(ins, outs, a):
    B, H, NC, C, K = outs[0]
    V = outs[3][4]
    form = DeltaForm(a["gate"])
    if not form.beta:
        return B * H * NC * 2 * C * C * K
    scores = 4 * C * C * K + (8 * C * K if form.decays else 0)
    wy = C * C * C // 3 + 2 * C * C * K + 2 * C * C * V
    return B * H * NC * (scores + wy)


defop("chunk_prepare", "q k v beta? g?", "q_decayed k_decayed w u aqk decay_last",
      attrs={"chunk_size": attr("int", lo=1), "gate": attr("str", choices=GATES)}, infer=_prepare_infer,
      ref=_prepare_ref, flops=_prepare_flops, families="chunked",
      doc="pad T to NC*C; G = cumsum(g); A = (I + L)^-1 diag(beta) by forward substitution; "
          "w = A (exp(G) k), u = A v, aqk masked j <= i. gate: channel (kda) | head (gated delta rule) | "
          "none (delta rule) | linear (linear attention: A = I, w = 0, no beta)")


def _scan_infer(w, u, k_decayed, decay_last, state) -> list[TensorType]:
    expect(u.rank == 5 and w.rank == 5 and k_decayed.rank == 5, "chunk-shape",
           f"chunk_state_scan takes [B, H, NC, C, *] tensors, got {w}, {u}, {k_decayed}")
    B, H, NC, C, V = u.shape
    K = k_decayed.shape[4]
    expect(_same_dims(w.shape, (B, H, NC, C, K)), "chunk-shape", f"w must be {_fmt((B, H, NC, C, K))}, got {w}")
    expect(decay_last.rank == 4 and _same_dims(decay_last.shape[:3], (B, H, NC)), "chunk-shape",
           f"decay_last must be [B, H, NC, K or 1], got {decay_last}")
    check_state(state, (B, H, K, V))
    return [u, TensorType("f32", (B, H, NC, K, V)), state]


def _scan_ref(w, u, k_decayed, decay_last, state):
    return dc.chunk_state_scan(w, u, k_decayed, decay_last, state)


def _scan_flops(ins, outs, a):
    B, H, NC, C, V = ins[1]
    K = ins[2][4]
    return B * H * NC * (4 * C * K * V + K * V + C * V)


defop("chunk_state_scan", "w u k_decayed decay_last state", "v_new start_states state_out",
      infer=_scan_infer, ref=_scan_ref, flops=_scan_flops, families="chunked",
      doc="for each chunk n: v_new = u - w S; starts[n] = S; S = decay_last * S + k_decayed^T v_new")


def _output_infer(q_decayed, aqk, v_new, starts, *, scale, T) -> list[TensorType]:
    B, H, NC, C, V = v_new.shape
    expect(_same_dims(aqk.shape, (B, H, NC, C, C)), "chunk-shape", f"aqk must be {_fmt((B, H, NC, C, C))}")
    expect(_same_dims(starts.shape, (B, H, NC, q_decayed.shape[4], V)), "chunk-shape",
           f"start states must be [B, H, NC, K, V], got {starts}")
    return [TensorType("f32", (B, T, H, V))]


def _output_flops(ins, outs, a):
    B, H, NC, C, V = ins[2]
    K = ins[0][4]
    return B * H * NC * (2 * C * K * V + 2 * C * C * V + C * V)


defop("chunk_output", "q_decayed aqk v_new start_states", "o",
      attrs={"scale": attr("float", lo=0, lo_open=True), "T": attr("dim")},
      infer=_output_infer, ref=lambda qd, aqk, vn, st, scale, T: dc.chunk_output(qd, aqk, vn, st, scale, T),
      flops=_output_flops, families="chunked", doc="o = scale * ((q exp G) S_start + aqk v_new), unpadded to T")
