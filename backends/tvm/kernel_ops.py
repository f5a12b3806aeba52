"""Lowerings of the recurrent, attention, MoE and fused IR ops: TensorIR kernels from
`k3c.kernels.<op>.tvm`, called with `call_tir`, glued by a few Relax operators (reshapes, the
expert weight transposes, MLA's up-projections).

Each registers in the `tvm` table of k3c.backends.tables (cell "TIR"), with the check that
its kernel computes in float32. What a graph holds is the passes' decision, and each op
lowers one way: a recurrent delta-rule op runs the recurrent kernel (a block per (batch,
head) walking T; chunk-delta-rule has rewritten the prefill ones into the chunk pieces of
chunk_ops.py), `mla_attention` up-projects the latent cache, and `mla_attention_absorbed`
(what fold-latent-moe makes of a decode step) attends in the latent space.
"""

from __future__ import annotations

import sympy
from tvm import relax, tirx

from ...ir import OPS, named_inputs
from ...ir import dims as D
from ...ir.ops.delta_family import FAMILY
from ...kernels.attention.tvm import KEY_BLOCK, causal_attention
from ...kernels.attention.tvm import SCHEDULES as ATTN_SCHEDULES
from ...kernels.attn_res.tvm import SCHEDULES as RES_SCHEDULES
from ...kernels.attn_res.tvm import attn_res_mix
from ...kernels.delta.tvm import linear as linear_recurrent
from ...kernels.delta.tvm import recurrent
from ...kernels.kda_decode import tvm as kda_decode
from ...kernels.moe.tvm import SCHEDULES as MOE_SCHEDULES
from ...kernels.moe.tvm import moe_down, moe_gate_up
from ...kernels.moe.tvm import panel as moe_panel
from ...kernels.short_conv.tvm import SCHEDULES as CONV_SCHEDULES
from ...kernels.short_conv.tvm import short_conv
from ...kernels.situ.tvm import situ
from ..signs import check_decays
from ..tables import builtin, builtin_family
from .context import LowerContext
from .dims import static_int
from .latent import into_latent, last_rows, latent_attention, out_of_latent
from .relax_ops import as_f32, decode_step, packable, packed_gemm, stored

R = relax.op


def _static(ctx: LowerContext, value: str, *axes: int) -> list[int]:
    shape = ctx.type_of(value).shape
    return [static_int(shape[a], f"dim {a} of %{value}") for a in axes]


def _rows(ctx: LowerContext, value: str, keep: int = 1):
    """The product of all but the last `keep` dims of a value, as a TIR expression."""
    lead = ctx.type_of(value).shape[:-keep]
    return ctx.dims.expr(D.normalize(sympy.Mul(*[sympy.sympify(d) for d in lead]))) if lead else 1


# ---------------------------------------------------------------- recurrent delta rule

def _delta_member(ctx: LowerContext, node, q, k, v, state, g=None, beta=None, z=None):
    """Any delta-family op, by the gate kind of its spec (ir/ops/delta_family.py): the recurrent
    kernel of the delta rule (q k v [g] beta state), or of normalised linear attention (q k v state z)."""
    form = OPS[node.op].delta
    if form.normaliser:
        return _linear_attention(ctx, node, q, k, v, state, z)
    gate = form.gate
    scale, ir = ctx.attrs(node)["scale"], ctx.ir(node)
    H, K = _static(ctx, ir["q"], 2, 3)
    (V,) = _static(ctx, ir["v"], 3)
    B, T = ctx.shape(ir["q"])[:2]
    if not form.decays:
        decay = R.reshape(beta, relax.ShapeExpr([B, T, H, 1]))  # unread placeholder
    else:
        decay = R.exp(g if gate == "channel" else R.reshape(g, relax.ShapeExpr([B, T, H, 1])))
    gv = ctx.kernel(("delta_recurrent", gate, H, K, V, scale),
                    lambda: recurrent.delta_recurrent(H, K, V, gate, scale, ctx.target), recurrent.SCHEDULES)
    return ctx.call_tir(gv, [q, k, v, ctx.bb.emit(decay), beta, state], ctx.out_types(node))


def _linear_attention(ctx: LowerContext, node, q, k, v, state, z):
    scale, ir = ctx.attrs(node)["scale"], ctx.ir(node)
    H, K = _static(ctx, ir["q"], 2, 3)
    (V,) = _static(ctx, ir["v"], 3)
    gv = ctx.kernel(("linear_recurrent", H, K, V, scale),
                    lambda: linear_recurrent.linear_recurrent(H, K, V, scale, ctx.target), linear_recurrent.SCHEDULES)
    return ctx.call_tir(gv, [q, k, v, state, z], ctx.out_types(node))


def _short_conv(ctx: LowerContext, node, x, w, state):
    act = ctx.attrs(node)["activation"]
    C, W = _static(ctx, ctx.ir(node)["w"], 0, 1)
    gv = ctx.kernel(("short_conv", C, W, act), lambda: short_conv(C, W, act), CONV_SCHEDULES)
    return ctx.call_tir(gv, [x, w, state], ctx.out_types(node))


def _kda_decode_step(ctx: LowerContext, node, **inputs):
    """KDA's fused decode step: one kernel per layer call, a block per (batch, head)."""
    a, ir = ctx.attrs(node), ctx.ir(node)
    H, K = _static(ctx, ir["f"], 2, 3)
    (V,) = _static(ctx, ir["o_gate"], 3)
    (W,) = _static(ctx, ir["q_w"], 1)
    key = ("kda_decode_step", H, K, V, W, a["scale"], a["gate"], a["lower_bound"], a["activation"], a["qk_eps"],
           a["eps"])
    gv = ctx.kernel(key, lambda: kda_decode.kda_decode_step(H, K, V, W, a["scale"], a["gate"], a["lower_bound"],
                                                            a["activation"], a["qk_eps"], a["eps"], ctx.target),
                    kda_decode.SCHEDULES)
    return ctx.call_tir(gv, list(inputs.values()), ctx.out_types(node))


# ---------------------------------------------------------------------------- attention

def attention(ctx: LowerContext, q, k, v, H: int, G: int, D_: int, Dv: int, scale: float, out_shape,
              decode: bool, name: str = "causal_attention", positions=None) -> relax.Expr:
    """The causal attention kernel on q [B, L, H, D], k [B, S, G, D], v [B, S, G, Dv]
    (the kernel takes the keys transposed and padded by a key block, [B, G, D, S + KB]);
    `decode`: the queries are a decode step's (one row each). `positions` (int64 [B]): k and v
    are a fixed-capacity cache and row t of sequence b sees keys <= positions[b] + t (the
    kernel reads the key blocks below that alone); else the last L of the S keys are the
    queries' own."""
    rows = 1 if decode else None  # a decode step: no row tiles
    cached = positions is not None
    gv = ctx.kernel((name, H, G, D_, Dv, scale, rows) + (("cached",) if cached else ()),
                    lambda: causal_attention(H, G, D_, Dv, scale, ctx.target, R=rows, cached=cached), ATTN_SCHEDULES)
    pad = R.zeros(relax.ShapeExpr([out_shape[0], G, D_, KEY_BLOCK]), "float32")
    kT = ctx.bb.emit(R.concat([R.permute_dims(k, [0, 2, 3, 1]), pad], axis=3))
    args = [q, kT, v] + ([positions] if cached else [])
    return ctx.call_tir(gv, args, [relax.TensorType(out_shape, "float32")])[0]


def _causal_attention(ctx: LowerContext, node, q, k, v):
    ir = ctx.ir(node)
    H, Dq = _static(ctx, ir["q"], 2, 3)
    (Dv,) = _static(ctx, ir["v"], 3)
    return attention(ctx, q, k, v, H, H, Dq, Dv, ctx.attrs(node)["scale"], ctx.shape(node.outputs[0]),
                     D.decode_step(ctx.graph, ir["q"]))


def mla_keys_values(ctx: LowerContext, node, ckv, krope, w_kv_b):
    """MLA's latent cache up-projected to per-head keys [B, S, H, Dn + Dr] and values
    [B, S, H, Dv] (krope shared by the heads)."""
    a, ir = ctx.attrs(node), ctx.ir(node)
    H, Dq = _static(ctx, ir["q"], 2, 3)
    (Dr,) = _static(ctx, ir["krope"], 2)
    Dn, Dv = Dq - Dr, a["v_head_dim"]
    B, S = ctx.shape(ir["ckv"])[:2]
    wdtype = stored(ctx, ir["w_kv_b"])
    if wdtype is not None and ctx.target == "llvm":  # the up-projection reads the BF16 weight as stored
        (Dc,) = _static(ctx, ir["ckv"], 2)
        ckv2 = ctx.bb.emit(R.reshape(ckv, relax.ShapeExpr([B * S, Dc])))
        kv = packed_gemm(ctx, ckv2, w_kv_b, B * S, H * (Dn + Dv), Dc, decode=False, wdtype=wdtype)
    else:
        kv = R.matmul(ckv, R.permute_dims(as_f32(ctx, ir["w_kv_b"], w_kv_b), [1, 0]))
    kv = R.reshape(kv, relax.ShapeExpr([B, S, H, Dn + Dv]))
    parts = ctx.bb.emit(R.split(kv, [Dn], axis=3))
    k_rope = R.broadcast_to(R.expand_dims(krope, [2]), relax.ShapeExpr([B, S, H, Dr]))
    k = ctx.bb.emit(R.concat([relax.TupleGetItem(parts, 0), k_rope], axis=3))
    return k, ctx.bb.emit(relax.TupleGetItem(parts, 1))


def mla_attention(ctx: LowerContext, node, q, ckv, krope, w_kv_b, positions=None):
    """Up-project the latent cache to per-head keys and values, then attend (`positions`: over a
    fixed-capacity cache, as `attention`)."""
    a, ir = ctx.attrs(node), ctx.ir(node)
    H, Dq = _static(ctx, ir["q"], 2, 3)
    k, v = mla_keys_values(ctx, node, ckv, krope, w_kv_b)
    return attention(ctx, q, k, v, H, H, Dq, a["v_head_dim"], a["scale"], ctx.shape(node.outputs[0]),
                     D.decode_step(ctx.graph, ir["q"]), positions=positions)


def mla_absorbed(ctx: LowerContext, node, q, ckv, krope, w_uk, w_uv, H: int, Dn: int, Dv: int, Dc: int, Dr: int,
                 scale: float) -> relax.Expr:
    """scores = [q_nope W_UK | q_rope] . [ckv | krope]; o = softmax(scores) ckv W_UV^T.

    w_uk [H, Dn, Dc], w_uv [H, Dv, Dc]: weight transforms only, lifted out of the call. A decode
    step on llvm takes the split-key latent kernels (latent.py), which read the growing cache in
    place; otherwise the causal attention kernel with the one latent head (its keys transposed).
    """
    B, T = ctx.shape(ctx.ir(node)["q"])[:2]
    if ctx.target == "llvm" and D.decode_step(ctx.graph, ctx.ir(node)["q"]):  # the cache read in place
        return latent_attention(ctx, q, ckv, krope, w_uk, w_uv, last_rows(ctx, krope, Dr, B), B, T, H, Dn, Dv, Dc, Dr,
                                None, scale)
    q_abs = into_latent(ctx, q, w_uk, B, T, H, Dn, Dc)
    k_abs = R.expand_dims(R.concat([ckv, krope], axis=2), [2])  # [B, S, 1, Dc + Dr]
    o_lat = attention(ctx, q_abs, ctx.bb.emit(k_abs), ctx.bb.emit(R.expand_dims(ckv, [2])),
                      H, 1, Dc + Dr, Dc, scale, [B, T, H, Dc], D.decode_step(ctx.graph, ctx.ir(node)["q"]),
                      name="mla_latent_attention")
    return out_of_latent(o_lat, w_uv, B, T, H, Dc, Dv)


def _mla_attention_absorbed(ctx: LowerContext, node, q, ckv, krope, w_uk, w_uv):
    ir = ctx.ir(node)
    H, Dq = _static(ctx, ir["q"], 2, 3)
    (Dr,) = _static(ctx, ir["krope"], 2)
    (Dc,) = _static(ctx, ir["ckv"], 2)
    (Dv,) = _static(ctx, ir["w_uv"], 1)
    return mla_absorbed(ctx, node, q, ckv, krope, w_uk, w_uv, H, Dq - Dr, Dv, Dc, Dr, ctx.attrs(node)["scale"])


def _attn_res_mix(ctx: LowerContext, node, V, w, n):
    shape = ctx.type_of(ctx.ir(node)["V"]).shape
    N, d = static_int(shape[0], "AttnRes candidate count"), static_int(shape[-1], "AttnRes width")
    eps = ctx.attrs(node)["eps"]
    gv = ctx.kernel(("attn_res_mix", N, d, eps), lambda: attn_res_mix(N, d, eps, ctx.target), RES_SCHEDULES)
    rows = _rows(ctx, node.outputs[0])
    V3 = ctx.bb.emit(R.reshape(V, relax.ShapeExpr([N, rows, d])))
    (y,) = ctx.call_tir(gv, [V3, w, n], [relax.TensorType([rows, d], "float32")])
    return R.reshape(y, relax.ShapeExpr(ctx.shape(node.outputs[0])))


# ----------------------------------------------------------------------------------- MoE

def _moe_rows(ctx: LowerContext, tokens: str) -> int:
    """Routed rows per tile of the expert kernels: 1 in a decode step (k3c.ir.decode_step), where
    an expert sees about one row and a taller tile only adds work; 6 when the tokens span a
    sequence (prefill)."""
    return 1 if D.decode_step(ctx.graph, tokens, axis=0) else 6


def _panels(ctx: LowerContext, w, E: int, n_out: int, n_in: int) -> relax.Expr:
    """Expert weights [E, out, in] -> [E, out / F, in, F] (weight-only: lifted to load time)."""
    F = moe_panel(n_out)
    return ctx.bb.emit(R.permute_dims(R.reshape(w, [E, n_out // F, F, n_in]), [0, 1, 3, 2]))


def _gate_up(ctx: LowerContext, h, w13, idx, E: int, D_: int, I2: int, k: int, N, rows: int) -> relax.Expr:
    gv = ctx.kernel(("moe_gate_up", E, D_, I2, k, rows), lambda: moe_gate_up(E, D_, I2, k, ctx.target, rows),
                    MOE_SCHEDULES)
    return ctx.call_tir(gv, [h, _panels(ctx, w13, E, I2, D_), idx], [relax.TensorType([N, k, I2], "float32")])[0]


def _down(ctx: LowerContext, a, w2, idx, w, E: int, I: int, Dout: int, k: int, N, rows: int) -> relax.Expr:
    gv = ctx.kernel(("moe_down", E, I, Dout, k, rows), lambda: moe_down(E, I, Dout, k, ctx.target, rows),
                    MOE_SCHEDULES)
    return ctx.call_tir(gv, [a, _panels(ctx, w2, E, Dout, I), idx, w], [relax.TensorType([N, Dout], "float32")])[0]


def _moe_gate_up(ctx: LowerContext, node, h, w13, idx):
    ir = ctx.ir(node)
    E, I2, D_ = _static(ctx, ir["w13"], 0, 1, 2)
    (k,) = _static(ctx, ir["idx"], 1)
    return _gate_up(ctx, h, w13, idx, E, D_, I2, k, ctx.shape(ir["h"])[0], _moe_rows(ctx, ir["h"]))


def _moe_down(ctx: LowerContext, node, a, w2, idx, w):
    ir = ctx.ir(node)
    E, Dout, I = _static(ctx, ir["w2"], 0, 1, 2)
    (k,) = _static(ctx, ir["idx"], 1)
    return _down(ctx, a, w2, idx, w, E, I, Dout, k, ctx.shape(ir["a"])[0], _moe_rows(ctx, ir["a"]))


def _activation(ctx: LowerContext, x2, rows, I: int, act: str, beta, linear_beta) -> relax.Expr:
    """The packed SiTU / SiLU-GLU kernel on x2 [rows, 2I] -> [rows, I]. With a static row count
    (a module captured with dynamic=False) it is kept out of fusion: FuseTIR (TVM 0.27) could
    not map the kernel's symbolic rows onto the static reshapes fused after it ("Inconsistent
    buffers ... mapped to the same relax var")."""
    if isinstance(rows, (int, tirx.IntImm)):
        gv = ctx.kernel(("situ_packed", I, act, beta, linear_beta, "opaque"),
                        lambda: situ(I, act, beta, linear_beta, packed=True).with_attr("op_pattern", 8))
        return ctx.call_tir(gv, [x2], [relax.TensorType([rows, I], "float32")])[0]
    gv = ctx.kernel(("situ_packed", I, act, beta, linear_beta), lambda: situ(I, act, beta, linear_beta, packed=True))
    return ctx.call_tir(gv, [x2], [relax.TensorType([rows, I], "float32")])[0]


def _moe_experts(ctx: LowerContext, node, h, w13, w2, idx, w):
    a, ir = ctx.attrs(node), ctx.ir(node)
    E, I2, D_ = _static(ctx, ir["w13"], 0, 1, 2)
    (Dout,) = _static(ctx, ir["w2"], 1)
    (k,) = _static(ctx, ir["idx"], 1)
    N = ctx.shape(ir["h"])[0]
    rows = _moe_rows(ctx, ir["h"])
    gu = _gate_up(ctx, h, w13, idx, E, D_, I2, k, N, rows)
    gu2 = ctx.bb.emit(R.reshape(gu, relax.ShapeExpr([N * k, I2])))
    act = _activation(ctx, gu2, N * k, I2 // 2, a["act"], a["beta"], a["linear_beta"])
    act3 = ctx.bb.emit(R.reshape(act, relax.ShapeExpr([N, k, I2 // 2])))
    return _down(ctx, act3, w2, idx, w, E, I2 // 2, Dout, k, N, rows)


# --------------------------------------------------------------------------- SiTU / MLP

def _situ(ctx: LowerContext, node, gate, up):
    a, ir = ctx.attrs(node), ctx.ir(node)
    (I,) = _static(ctx, ir["gate"], -1)
    rows = _rows(ctx, ir["gate"])
    gv = ctx.kernel(("situ", I, a["beta"], a["linear_beta"]), lambda: situ(I, "situ", a["beta"], a["linear_beta"]))
    g2, u2 = (ctx.bb.emit(R.reshape(x, relax.ShapeExpr([rows, I]))) for x in (gate, up))
    (y,) = ctx.call_tir(gv, [g2, u2], [relax.TensorType([rows, I], "float32")])
    return R.reshape(y, relax.ShapeExpr(ctx.shape(node.outputs[0])))


def _gated_mlp(ctx: LowerContext, node, x, w):
    a, ir = ctx.attrs(node), ctx.ir(node)
    I2, D_ = _static(ctx, ir["w"], 0, 1)
    rows = _rows(ctx, ir["x"])
    x2 = R.reshape(x, relax.ShapeExpr([rows, D_]))
    if packable(ctx, node):
        gu = packed_gemm(ctx, ctx.bb.emit(x2), w, rows, I2, D_, decode=decode_step(ctx, ir["x"]),
                         wdtype=stored(ctx, ir["w"]), x_value=ir["x"])
    else:
        gu = ctx.bb.emit(R.matmul(x2, R.permute_dims(as_f32(ctx, ir["w"], w), [1, 0])))
    y = _activation(ctx, gu, rows, I2 // 2, a["act"], a["beta"], a["linear_beta"])
    return R.reshape(y, relax.ShapeExpr(ctx.shape(node.outputs[0])))


_RULES = {
    "short_conv": _short_conv, "kda_decode_step": _kda_decode_step,
    "causal_attention": _causal_attention, "mla_attention": mla_attention,
    "mla_attention_absorbed": _mla_attention_absorbed, "attn_res_mix": _attn_res_mix,
    "moe_gate_up": _moe_gate_up, "moe_down": _moe_down, "moe_experts": _moe_experts,
    "situ": _situ, "gated_mlp": _gated_mlp,
}



# The TensorIR kernels compute in float32 (the float policy of the TIR lowerings' entries).
KERNEL_FLOATS = ("f32",)


def tir(*ops: str, supports=None):
    """Register the lowering of `ops` by a TensorIR kernel (cell "TIR"): float32 values only,
    and `kernel_supports` (or `supports`) beside it."""
    return builtin("tvm", *ops, kind="TIR", supports=supports or kernel_supports, floats=KERNEL_FLOATS)


def kernel_supports(node, graph) -> tuple[bool, str]:
    """When a TensorIR kernel of this module takes a node (its values are float32: the entry's
    `floats`): a log-decay that is provably <= 0 (the chunk kernels clamp exponents at 0), and
    routed experts over a dynamic token count."""
    if node.op == "moe_experts" and isinstance(graph.types[named_inputs(node)["h"]].shape[0], int):
        # TVM 0.27's FuseTIR fails on this lowering at a static token count ("Inconsistent
        # buffers T_reshape and x mapped to the same relax var"): say so instead
        return False, ("the TVM routed-expert lowering needs a dynamic token count (a static one, as "
                       "dynamic=False gives, trips TVM's FuseTIR); capture with dynamic=True")
    return check_decays(graph, node, "TVM")


for _op, _fn in _RULES.items():
    tir(_op)(_fn)
builtin_family("tvm", FAMILY, kind="TIR", supports=kernel_supports, floats=KERNEL_FLOATS)(_delta_member)
