"""Lowerings of the chunked delta-rule ops (`chunk_prepare`, `chunk_state_scan`, `chunk_output`,
what the chunk-delta-rule pass makes of a prefill) to the TensorIR kernels of
k3c.kernels.delta.tvm.chunk, in the `tvm` table of k3c.backends.tables.
"""

from __future__ import annotations

from tvm import relax

from ...ir import Node
from ...kernels.delta.tvm import chunk
from .context import LowerContext
from .dims import static_int
from .kernel_ops import tir

R = relax.op


def _f32(shape) -> relax.TensorType:
    return relax.TensorType(shape, "float32")


def prepare(ctx: LowerContext, q, k, v, beta, g, *, gate: str, C: int, H: int, K: int, V: int, B, T, NC):
    """The three prepare kernels -> (q_dec, k_dec, w, u, aqk, decay_last) in chunk layout."""
    KD = K if gate == "channel" else 1
    if g is None:
        g = ctx.bb.emit(R.zeros(relax.ShapeExpr([B, T, H, 1]), "float32"))  # placeholder: never read
    elif gate == "head":
        g = ctx.bb.emit(R.reshape(g, relax.ShapeExpr([B, T, H, 1])))
    if beta is None:
        beta = ctx.bb.emit(R.zeros(relax.ShapeExpr([B, T, H]), "float32"))  # placeholder: never read
    ck = [B, H, NC, C, K]
    gates = ctx.kernel(("chunk_gates", gate, H, K, C), lambda: chunk.chunk_gates(H, K, C, gate, ctx.target),
                       chunk.SCHEDULES)
    G64 = relax.TensorType([B, H, NC, C, KD], "float64")  # cumulative gates (kernels/delta/tvm/common.py)
    qd, kd, kw, G, dl = ctx.call_tir(gates, [q, k, g], [_f32(ck), _f32(ck), _f32(ck), G64,
                                                        _f32([B, H, NC, KD])])
    scores = ctx.kernel(("chunk_scores", gate, H, K, C), lambda: chunk.chunk_scores(H, K, C, gate, ctx.target),
                        chunk.SCHEDULES)
    Lm, aqk = ctx.call_tir(scores, [q, k, beta, G], [_f32([B, H, NC, C, C])] * 2)
    solve = ctx.kernel(("chunk_solve", gate, H, K, V, C), lambda: chunk.chunk_solve(H, K, V, C, gate, ctx.target),
                       chunk.SCHEDULES)
    w, u = ctx.call_tir(solve, [Lm, kw, v, beta], [_f32(ck), _f32([B, H, NC, C, V])])
    return qd, kd, w, u, aqk, dl


def state_scan(ctx: LowerContext, w, u, kd, dl, state, *, H: int, K: int, V: int, C: int, KD: int, B, NC):
    scan = ctx.kernel(("chunk_state_scan", H, K, V, C, KD),
                      lambda: chunk.chunk_state_scan(H, K, V, C, KD, ctx.target), chunk.SCHEDULES)
    return ctx.call_tir(scan, [w, u, kd, dl, state],
                        [_f32([B, H, NC, C, V]), _f32([B, H, NC, K, V]), _f32([B, H, K, V])])


def output(ctx: LowerContext, qd, aqk, vn, starts, *, H: int, K: int, V: int, C: int, scale: float, B, T):
    out = ctx.kernel(("chunk_output", H, K, V, C, scale), lambda: chunk.chunk_output(H, K, V, C, scale, ctx.target),
                     chunk.SCHEDULES)
    return ctx.call_tir(out, [qd, aqk, vn, starts], [_f32([B, T, H, V])])[0]


def _qkv(ctx: LowerContext, node: Node):
    ir = ctx.ir(node)
    H, K = (static_int(d, f"dim of %{ir['q']}") for d in ctx.type_of(ir["q"]).shape[2:])
    V = static_int(ctx.type_of(ir["v"]).shape[3], f"dim 3 of %{ir['v']}")
    B, T = ctx.shape(ir["q"])[:2]
    return H, K, V, B, T


def _chunk_prepare(ctx: LowerContext, node: Node, q, k, v, beta, g):
    a = ctx.attrs(node)
    gate, C = a["gate"], a["chunk_size"]
    H, K, V, B, T = _qkv(ctx, node)
    NC = ctx.shape(node.outputs[0])[2]
    return list(prepare(ctx, q, k, v, beta, g, gate=gate, C=C, H=H, K=K, V=V, B=B, T=T, NC=NC))


def _chunk_state_scan(ctx: LowerContext, node: Node, w, u, k_decayed, decay_last, state):
    ir = ctx.ir(node)
    B, H, NC, C, V = ctx.type_of(ir["u"]).shape
    K = ctx.type_of(ir["k_decayed"]).shape[4]
    KD = ctx.type_of(ir["decay_last"]).shape[3]
    H, C, V, K, KD = (static_int(d, f"chunk dim of %{ir['u']}") for d in (H, C, V, K, KD))
    Bx, _, NCx = ctx.shape(ir["u"])[:3]
    return state_scan(ctx, w, u, k_decayed, decay_last, state, H=H, K=K, V=V, C=C, KD=KD, B=Bx, NC=NCx)


def _chunk_output(ctx: LowerContext, node: Node, q_decayed, aqk, v_new, start_states):
    a, ir = ctx.attrs(node), ctx.ir(node)
    _, H, _, C, K = ctx.type_of(ir["q_decayed"]).shape
    V = ctx.type_of(ir["v_new"]).shape[4]
    H, C, K, V = (static_int(d, f"chunk dim of %{ir['q_decayed']}") for d in (H, C, K, V))
    B, T = ctx.shape(node.outputs[0])[:2]
    return output(ctx, q_decayed, aqk, v_new, start_states, H=H, K=K, V=V, C=C, scale=a["scale"], B=B, T=T)


for _op, _fn in {"chunk_prepare": _chunk_prepare, "chunk_state_scan": _chunk_state_scan,
                 "chunk_output": _chunk_output}.items():
    tir(_op)(_fn)
