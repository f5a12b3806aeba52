"""KDA's decode step as one op, created by the fuse-kda-decode pass from a decode graph's
short convs, l2norms, forget gate, beta sigmoid, `kda` and `gated_rms_norm` (the math:
kernels/kda_decode/README.md). Its decomposition is those ops again, so a backend without a
kernel for it (ONNX, the reference) runs what it was fused from."""

from __future__ import annotations

from ...kernels.kda_decode.naive import GATES, naive_kda_decode_step
from .. import dims as D
from ..types import TensorType
from .recurrent import _fmt, _same_dims, check_state
from .spec import attr, defop, expect

INPUTS = "q_x k_x v_x q_w k_w v_w q_conv k_conv v_conv f a dt_bias b state o_gate norm_w"
OUTPUTS = "o state_out q_conv_out k_conv_out v_conv_out"


def _conv(x: TensorType, w: TensorType, s: TensorType, B, C, W, what: str) -> None:
    expect(x.rank == 3 and _same_dims(x.shape, (B, 1, C)), "decode-shape",
           f"kda_decode_step {what}_x must be [{D.to_str(B)}, 1, {D.to_str(C)}], got {x}")
    expect(w.rank == 2 and _same_dims(w.shape, (C, W)), "conv-shape",
           f"kda_decode_step {what}_w must be [{D.to_str(C)}, {D.to_str(W)}], got {w}")
    want = (B, C, D.normalize(W - 1))
    expect(_same_dims(s.shape, want), "state-shape", f"kda_decode_step {what}_conv must be {_fmt(want)}, got {s}")


def _infer(q_x, k_x, v_x, q_w, k_w, v_w, q_conv, k_conv, v_conv, f, a, dt_bias, b, state, o_gate, norm_w,
           **attrs) -> list[TensorType]:
    expect(f.rank == 4 and D.equal(f.shape[1], 1), "decode-shape", f"kda_decode_step f must be [B, 1, H, K], got {f}")
    B, _, H, K = f.shape
    expect(o_gate.rank == 4 and _same_dims(o_gate.shape[:3], (B, 1, H)), "decode-shape",
           f"kda_decode_step o_gate must be [B, 1, H, V] with f's B, H; got {o_gate}")
    V = o_gate.shape[3]
    expect(q_w.rank == 2, "conv-shape", f"kda_decode_step q_w must be [C, W], got {q_w}")
    W = q_w.shape[1]
    HK, HV = D.normalize(H * K), D.normalize(H * V)
    for x, w, s, C, what in ((q_x, q_w, q_conv, HK, "q"), (k_x, k_w, k_conv, HK, "k"), (v_x, v_w, v_conv, HV, "v")):
        _conv(x, w, s, B, C, W, what)
    expect(_same_dims(a.shape, (H, 1)), "gate-shape", f"kda_decode_step a must be [{D.to_str(H)}, 1], got {a}")
    expect(_same_dims(dt_bias.shape, (H, K)), "gate-shape",
           f"kda_decode_step dt_bias must be [{D.to_str(H)}, {D.to_str(K)}], got {dt_bias}")
    expect(_same_dims(b.shape, (B, 1, H)), "beta-shape",
           f"kda_decode_step b must be [{D.to_str(B)}, 1, {D.to_str(H)}], got {b}")
    expect(norm_w.rank == 1 and D.equal(norm_w.shape[0], V), "norm",
           f"kda_decode_step norm_w must be [{D.to_str(V)}], got {norm_w}")
    check_state(state, (B, H, K, V))
    return [o_gate.with_shape((B, 1, H, V)).with_dtype(v_x.dtype), state, q_conv, k_conv, v_conv]


def _decompose(bb, q_x, k_x, v_x, q_w, k_w, v_w, q_conv, k_conv, v_conv, f, a, dt_bias, b, state, o_gate, norm_w,
               *, scale, gate, lower_bound, activation, qk_eps, eps):
    """The ops the pass fused, in the order the models write them."""
    B, _, H, K = bb.type(f).shape
    V = bb.type(o_gate).shape[3]
    convs = [bb.op("short_conv", [x, w, s], activation=activation)
             for x, w, s in ((q_x, q_w, q_conv), (k_x, k_w, k_conv), (v_x, v_w, v_conv))]
    q, k = (bb.op("l2norm", [bb.op("reshape", [c[0]], shape=[B, 1, H, K])], eps=qk_eps) for c in convs[:2])
    v = bb.op("reshape", [convs[2][0]], shape=[B, 1, H, V])
    x = bb.op("add", [f, dt_bias])
    if gate == "sigmoid":
        g = bb.op("mul", [bb.op("sigmoid", [bb.op("mul", [a, x])]), bb.const(lower_bound, bb.type(f).dtype)])
    else:
        g = bb.op("mul", [a, bb.op("softplus", [x], beta=1.0, threshold=20.0)])
    o, state1 = bb.op("kda", [q, k, v, g, bb.op("sigmoid", [b]), state], scale=scale)
    return [bb.op("gated_rms_norm", [o, o_gate, norm_w], eps=eps), state1, *(c[1] for c in convs)]


def _flops(ins, outs, a) -> int:
    """Per head: the convs and l2norms over K, K, V channels, the gate over K, one delta step
    (decay, k^T S, rank-1 write, q^T S: 7 K V) and the gated norm over V."""
    B, _, H, K = ins[9]
    V, W = ins[14][3], ins[3][1]
    return (2 * W + 6) * B * H * (2 * K + V) + 7 * B * H * K * V + 10 * B * H * K + 10 * B * H * V


defop("kda_decode_step", INPUTS, OUTPUTS,
      attrs={"scale": attr("float", lo=0, lo_open=True), "gate": attr("str", "sigmoid", choices=GATES),
             "lower_bound": attr("float", -5.0), "activation": attr("str", "silu", choices=("none", "silu")),
             "qk_eps": attr("float", 1e-6, lo=0), "eps": attr("float", 1e-5, lo=0)},
      infer=_infer, ref=naive_kda_decode_step, decompose=_decompose, flops=_flops, families="recurrent fused",
      doc="KDA's decode step in one op: short convs, l2norm, forget gate, beta, one recurrent step, gated RMSNorm")
