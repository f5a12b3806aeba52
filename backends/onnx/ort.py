"""The `ort` flavour: IR ops mapped onto onnxruntime's own kernels where their semantics
match k3c's exactly, and two prefill forms in standard ops that onnxruntime runs faster than
the portable bodies (a depthwise Conv, one Gemm per routed expert); every other op keeps its
portable lowering (README.md has the table).

Each mapping registers in the `onnx:ort` table of k3c.backends.tables with its
`supports(node, graph) -> (ok, reason)`; a mapping that cannot express a node (symbolic head
sizes, SiTU experts, ...) says why and the node takes its portable lowering (the `onnx`
table); nothing is approximated. The recurrent ops reach this flavour whole: the backend
asks the chunk-delta-rule pass to keep them (OnnxBackend.takes_whole), so that onnxruntime's
LinearAttention runs the prefill too.
"""

from __future__ import annotations

import sympy
import torch

from ...ir import OPS, named_inputs
from ...ir import dims as D
from ...ir.ops.delta_family import FAMILY
from ...ir.types import FLOATS
from ..tables import builtin, builtin_family
from .builder import MS_DOMAIN, Builder, subgraph
from .functions.attention import absorbed_query, mla_keys_values
from .functions.conv import short_conv
from .functions.mlp import activation, moe_experts, sorted_slots
from .standard import ones_like_last

# onnxruntime's kernels that k3c maps onto compute in float32 here (the float policy of the
# `onnx:ort` table; RMSNormalization takes any float).
KERNEL_FLOATS = ("f32",)


def mapping(target: str, *ops: str, supports, floats: tuple[str, ...] | None = KERNEL_FLOATS):
    """Register an emitter of ops as onnxruntime's `target` ("domain::op") where `supports` holds."""
    return builtin("onnx:ort", *ops, kind=f"`{target}`", supports=supports, floats=floats)


def _static(*dims) -> bool:
    return all(not isinstance(d, sympy.Basic) for d in dims)


def _packed(b: Builder, x: str, width: int) -> str:
    """[B, T, H, D] -> [B, T, H * D] (a view)."""
    return b.Reshape(x, b.ints([0, 0, width]))


# ---- the delta family -> com.microsoft::LinearAttention ------------------------------------

# LinearAttention's update_rule for each gate kind of the family (ir/ops/delta_family.py)
_RULES = {"channel": "gated_delta", "head": "gated_delta", "none": "delta", "linear": "linear"}


def _la_applies(node, g):
    x = named_inputs(node)
    _, _, H, K = g.types[x["q"]].shape
    V = g.types[x["v"]].shape[3]
    if not _static(H, K, V):
        return False, "LinearAttention needs static head count and sizes"
    return True, ""


@builtin_family("onnx:ort", FAMILY, kind="`com.microsoft::LinearAttention`", supports=_la_applies,
                floats=KERNEL_FLOATS)
def _la_emit(lx, node, q, k, v, state, g=None, beta=None, z=None):
    """update_rule by the op's gate kind; a normaliser z rides as a ones column of the state.
    The delta family's inputs: q k v [g] beta state, or q k v state z (linear attention)."""
    form = OPS[node.op].delta
    outs = lx.outs(node)
    _, _, H, K = lx.type(q).shape
    V = lx.type(v).shape[3]
    q, k, v, state = lx.x(q), lx.x(k), lx.x(v), lx.x(state)
    if form.normaliser:
        _linear_attention_z(lx, q, k, v, state, lx.x(z), H, K, V, float(lx.attrs(node)["scale"]), outs)
        return
    decay, beta = (lx.x(g) if g is not None else None), lx.x(beta)
    linear_attention(lx, q, k, v, decay, beta, state, H, K, V, _RULES[form.gate], float(lx.attrs(node)["scale"]),
                     outs[0], outs[1], per_channel=form.gate == "channel")


def linear_attention(lx, q, k, v, decay, beta, state, H: int, K: int, V: int, rule: str, scale: float,
                     o_out: str, state_out: str, per_channel: bool = False) -> None:
    """One com.microsoft::LinearAttention on [B, T, H, *] tensors; the decay is per key
    channel [B, T, H, K] (KDA) or per head [B, T, H]."""
    b = lx.b
    if decay is not None and per_channel:
        decay = _packed(b, decay, H * K)
    o, _ = b.op("LinearAttention", [_packed(b, q, H * K), _packed(b, k, H * K), _packed(b, v, H * V), state, decay,
                                    beta], [b.fresh("o"), state_out], domain=MS_DOMAIN, q_num_heads=H,
                kv_num_heads=H, update_rule=rule, scale=scale)
    b.Reshape(o, b.ints([0, 0, H, V]), outputs=[o_out])


def _linear_attention_z(lx, q, k, v, state, z, H: int, K: int, V: int, scale: float, outs: list[str]) -> None:
    """Normalised linear attention: z rides as an all-ones value column, [S | z] is one state."""
    b = lx.b
    ones = b.Expand(b.const(1.0), b.Concat(b.Shape(v, end=3), b.ints([1]), axis=0))
    S1 = b.Concat(state, b.unsqueeze(z, -1), axis=-1)
    o1, S1_out = b.fresh("o1"), b.fresh("S1")
    linear_attention(lx, q, k, b.Concat(v, ones, axis=-1), None, None, S1, H, K, V + 1, "linear", scale, o1, S1_out)

    def cols(x, lo, hi):
        return b.Slice(x, b.ints([lo]), b.ints([hi]), b.ints([-1]))
    b.Div(cols(o1, 0, V), cols(o1, V, V + 1), outputs=[outs[0]])
    cols_S = cols(S1_out, 0, V)
    b.Identity(cols_S, outputs=[outs[1]])
    b.Squeeze(cols(S1_out, V, V + 1), b.ints([-1]), outputs=[outs[2]])


# ---- short_conv -> com.microsoft::CausalConvWithState --------------------------------------

@mapping("com.microsoft::CausalConvWithState / ai.onnx::Conv", "short_conv", supports=None)
def _conv_emit(lx, node, x, w, state):
    """channels_last=1, the state transposed in and out; group = C for many tokens."""
    if lx.type(x).shape[1] != 1:
        return _depthwise_emit(lx, node, x, w, state)
    b = lx.b
    (y, state_out), x, w, state = lx.outs(node), lx.x(x), lx.x(w), lx.x(state)
    weight = b.unsqueeze(w, 1)  # [C, 1, W]: constant-folded when w is (a view of) a weight
    past = b.Transpose(state, perm=[0, 2, 1])  # channels-last state [B, W-1, C]
    act = lx.attrs(node)["activation"]
    out, present = b.op("CausalConvWithState", [x, weight, None, past], [y, b.fresh("present")], domain=MS_DOMAIN,
                        activation=act, channels_last=1)
    b.Transpose(present, outputs=[state_out], perm=[0, 2, 1])


def _depthwise_emit(lx, node, x, w, state):
    """Many tokens: the standard depthwise Conv (group = C) over [state ++ x] channels-first,
    the portable body's form (functions/conv.py) inline with the weight's static C.
    onnxruntime's CausalConvWithState CPU kernel is about 4x slower than this at T = 1024
    (k3-small's widths); it keeps the one-token steps of decode, where it is the fastest."""
    C = int(lx.type(w).shape[0])
    (y, state_out), x, w, state = lx.outs(node), lx.x(x), lx.x(w), lx.x(state)
    out, tail = short_conv(lx.b, x, w, state, C, silu=lx.attrs(node)["activation"] == "silu")
    lx.b.Identity(out, outputs=[y])
    lx.b.Identity(tail, outputs=[state_out])


# ---- rms_norm -> RMSNormalization ----------------------------------------------------------

def _rms_applies(node, g):
    if g.types[named_inputs(node)["x"]].dtype not in FLOATS:
        return False, "float inputs only"
    return True, ""


@mapping("ai.onnx::RMSNormalization", "rms_norm", supports=_rms_applies, floats=None)
def _rms_emit(lx, node, x, w):
    """stash_type=1 (fp32)."""
    xx = lx.x(x)
    scale = lx.x(w) if w is not None else ones_like_last(lx, x)
    lx.b.op("RMSNormalization", [xx, scale], lx.outs(node), axis=-1, epsilon=float(lx.attrs(node)["eps"]), stash_type=1)


# ---- attention -> Attention (opset 23) -----------------------------------------------------

def _mask(lx, T, S, q: str, k: str, seq_axis: int) -> tuple[str | None, int]:
    """(attn_mask, is_causal) for k3c's bottom-right causal mask with T queries and S keys."""
    if D.equal(T, S):
        return None, 1
    if _static(T) and int(T) == 1:
        return None, 0  # one query sees every key
    b = lx.b
    Tn, Sn = b.shape_of(q, seq_axis), b.shape_of(k, seq_axis)
    zero, one = b.const(0, "i64"), b.const(1, "i64")
    t = b.unsqueeze(b.Range(zero, b.squeeze(Tn, 0), one), 1)
    s = b.unsqueeze(b.Range(zero, b.squeeze(Sn, 0), one), 0)
    return b.Not(b.Greater(s, b.Add(t, b.Sub(Sn, Tn)))), 0


def _attn_applies(node, g):
    x = named_inputs(node)
    q, k, v = (g.types[x[n]] for n in "qkv")
    if not _static(q.shape[2], q.shape[3], k.shape[2], v.shape[3]):
        return False, "Attention needs static head count and sizes"
    return True, ""


def _attention(lx, q: str, k: str, v: str, T, S, H: int, Dv: int, scale: float, out: str) -> None:
    """Attention on packed [B, T, H*D] / [B, S, H*D] / [B, S, H*Dv]; out [B, T, H, Dv]."""
    b = lx.b
    mask, causal = _mask(lx, T, S, q, k, 1)
    y = b.op("Attention", [q, k, v, mask], 1, q_num_heads=H, kv_num_heads=H, scale=scale, is_causal=causal)
    b.Reshape(y, b.ints([0, 0, H, Dv]), outputs=[out])


@mapping("ai.onnx::Attention", "causal_attention", supports=_attn_applies)
def _causal_emit(lx, node, q, k, v):
    """3-D packed heads."""
    qt, kt, vt = lx.type(q), lx.type(k), lx.type(v)
    (o,), q, k, v = lx.outs(node), lx.x(q), lx.x(k), lx.x(v)
    _, T, H, Dq = qt.shape
    S, Dv = kt.shape[1], vt.shape[3]
    b = lx.b
    _attention(lx, _packed(b, q, H * Dq), _packed(b, k, H * Dq), _packed(b, v, H * Dv), T, S, H, Dv,
               float(lx.attrs(node)["scale"]), o)


def _mla_applies(node, g):
    x = named_inputs(node)
    q, ckv, krope = (g.types[x[n]] for n in ("q", "ckv", "krope"))
    if not _static(q.shape[2], q.shape[3], krope.shape[2], ckv.shape[2]):
        return False, "Attention needs static head count and sizes"
    return True, ""


@mapping("ai.onnx::Attention", "mla_attention", supports=_mla_applies)
def _mla_emit(lx, node, q, ckv, krope, w_kv_b):
    """Keys and values up-projected first."""
    qt, ct = lx.type(q), lx.type(ckv)
    (o,), q, ckv, krope, w = lx.outs(node), lx.x(q), lx.x(ckv), lx.x(krope), lx.x(w_kv_b)
    _, T, H, Dq = qt.shape
    Dv = int(lx.attrs(node)["v_head_dim"])
    b = lx.b
    k, v = mla_keys_values(b, q, ckv, krope, w)
    _attention(lx, _packed(b, q, H * Dq), _packed(b, k, H * Dq), _packed(b, v, H * Dv), T, ct.shape[1], H, Dv,
               float(lx.attrs(node)["scale"]), o)


@mapping("ai.onnx::Attention", "mla_attention_absorbed", supports=_mla_applies)
def _absorbed_emit(lx, node, q, ckv, krope, w_uk, w_uv):
    """One KV head (MQA), 4-D."""
    T, S = lx.type(q).shape[1], lx.type(ckv).shape[1]
    (o,), q, ckv, krope, w_uk, w_uv = lx.outs(node), lx.x(q), lx.x(ckv), lx.x(krope), lx.x(w_uk), lx.x(w_uv)
    b = lx.b
    q_abs = absorbed_query(b, q, krope, w_uk)  # [B, H, T, Dc + Dr]
    k_abs = b.unsqueeze(b.Concat(ckv, krope, axis=-1), 1)  # [B, 1, S, Dc + Dr]: one KV head
    mask, causal = _mask(lx, T, S, q_abs, k_abs, 2)
    o_lat = b.op("Attention", [q_abs, k_abs, b.unsqueeze(ckv, 1), mask], 1, scale=float(lx.attrs(node)["scale"]),
                 is_causal=causal)
    b.Transpose(b.MatMul(o_lat, b.Transpose(w_uv, perm=[0, 2, 1])), outputs=[o], perm=[0, 2, 1, 3])



# ---- routed experts -> com.microsoft::MoE --------------------------------------------------

def _moe_applies(node, g):
    if node.attrs.get("act") != "silu":
        return False, "onnxruntime's MoE has no SiTU activation"
    x = named_inputs(node)
    h, w13, w2 = (g.types[x[n]] for n in ("h", "w13", "w2"))
    if x["w13"] not in g.weights or x["w2"] not in g.weights:
        return False, "MoE needs the expert weights as initializers (they are re-laid out)"
    if not D.equal(w2.shape[1], h.shape[1]):
        return False, "MoE's output width must equal its input width"
    return True, ""


def _interleave(w13: torch.Tensor) -> torch.Tensor:
    """[E, 2I, D] gate rows then up rows -> rows interleaved g0, u0, g1, u1 (swiglu_fusion=1)."""
    E, I2, Dm = w13.shape
    return torch.stack([w13[:, : I2 // 2], w13[:, I2 // 2:]], 2).reshape(E, I2, Dm)


def _moe_emit(lx, node, h, w13, w2, idx, w):
    """y = s * MoE(h, log(w) at the routed experts): ORT's MoE takes a softmax of router logits
    over the top k, which gives w / s with s = sum_j w_j; scaling by s restores w exactly.
    w < 0 cannot be a logit: such inputs take the function body (an If on min(w) >= 0)."""
    k, E = lx.type(idx).shape[1], lx.type(w13).shape[0]
    (y,), h, w13_name, w13, w2, idx, w = lx.outs(node), lx.x(h), w13, lx.x(w13), lx.x(w2), lx.x(idx), lx.x(w)
    b = lx.b
    fc1 = lx.weight_as(w13_name, "swiglu", _interleave)
    s = b.ReduceSum(w, b.ints([-1]), keepdims=1)  # [N, 1]

    mo = Builder("moe_ort")
    logits = mo.Where(mo.Greater(w, mo.const(0.0)), mo.Log(w), mo.const(-1e30))
    sentinel = mo.Expand(mo.const(float("-inf")), mo.Concat(mo.Shape(idx, end=1), mo.ints([E]), axis=0))
    probs = mo.ScatterElements(sentinel, idx, logits, axis=1)
    routed = mo.op("MoE", [h, probs, fc1, None, w2], 1, domain=MS_DOMAIN, k=int(k), activation_type="swiglu",
                   swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0, normalize_routing_weights=1)
    kernel = mo.Mul(routed, s)
    fb = Builder("moe_body")
    body = moe_experts(fb, h, w13, w2, idx, w, "silu")
    nonneg = b.squeeze(b.Not(b.Less(b.ReduceMin(w, keepdims=1), b.const(0.0))), 0, 1)
    b.op("If", [nonneg], [y], then_branch=subgraph(mo, "ort_moe", [], [(kernel, "f32", 2)]),
         else_branch=subgraph(fb, "moe_body", [], [(body, "f32", 2)]))
    lx.b.domains.add(MS_DOMAIN)


# Unrolling writes about 15 nodes per expert and layer: 256 experts are some 4k nodes a
# layer; K3's 896 would put over a million in the graph, so larger E keeps the body's Loop.
MAX_UNROLLED_EXPERTS = 256


def _unrolled_applies(node, g):
    x = named_inputs(node)
    if x["w13"] not in g.weights or x["w2"] not in g.weights:
        return False, "the per-expert form needs the expert weights as initializers"
    if int(g.types[x["w13"]].shape[0]) > MAX_UNROLLED_EXPERTS:
        return False, f"more than {MAX_UNROLLED_EXPERTS} experts: the unrolled graph would be too large"
    N = g.types[x["h"]].shape[0]
    E, k = g.types[x["w13"]].shape[0], g.types[x["idx"]].shape[1]
    few = int(N) * int(k) <= int(E) if D.is_static(N) else D.decode_step(g, x["h"], axis=0)
    if few:
        return False, "few tokens (a decode step) keep the body, whose gathered form reads only the routed experts"
    return True, ""


def _unrolled_body(b: Builder, h: str, w13: str, w2: str, idx: str, w: str, E: int, k: int, act: str,
                   beta, linear_beta, y: str) -> None:
    """Each expert's slots (a Split of the sorted rows) through two Gemms against Gather(w, e):
    constants that onnxruntime folds and prepacks at load. The outputs are concatenated in
    expert order, gathered back to slot order, weighted and summed per token."""
    counts, dest, perm = sorted_slots(b, idx, E)
    rows = b.Gather(h, b.Div(perm, b.const(k, "i64")), axis=0)  # [N k, D]: each slot's token
    outs = []
    for e, part in enumerate(b.op("Split", [rows, counts], E, axis=0)):
        e_ = b.const(e, "i64")
        gu = b.Gemm(part, b.Gather(w13, e_, axis=0), transB=1)
        outs.append(b.Gemm(activation(b, gu, act, beta, linear_beta), b.Gather(w2, e_, axis=0), transB=1))
    out = b.Concat(*outs, axis=0)  # [N k, D_out] in expert order
    per_slot = b.Mul(b.Gather(out, dest, axis=0), b.unsqueeze(b.Reshape(w, b.ints([-1])), 1))
    D_out = b.shape_of(w2, 1)
    b.ReduceSum(b.Reshape(per_slot, b.Concat(b.ints([-1, k]), D_out, axis=0)), b.ints([1]), keepdims=0, outputs=[y])


def _unrolled_emit(lx, node, h, w13, w2, idx, w):
    """Many tokens (a prefill): routed experts as one Gemm per expert over the slots sorted by
    expert. No Loop, no padding, no per-expert copy of a weight or of the result; the weights
    are read only through the folded per-expert constants, so onnxruntime keeps one copy."""
    E, k = int(lx.type(w13).shape[0]), int(lx.type(idx).shape[1])
    (y,), h, w13, w2, idx, w = lx.outs(node), lx.x(h), lx.x(w13), lx.x(w2), lx.x(idx), lx.x(w)
    b = lx.b
    a = lx.attrs(node)
    act = a["act"]
    beta = linear_beta = None
    if act != "silu":
        beta, linear_beta = b.param(float(a["beta"])), a["linear_beta"]
        linear_beta = b.param(float(linear_beta)) if linear_beta is not None else None
    _unrolled_body(b, h, w13, w2, idx, w, E, k, act, beta, linear_beta, y)


def _experts_applies(node, g):
    if _moe_applies(node, g)[0]:
        return True, ""
    return _unrolled_applies(node, g)


@mapping("com.microsoft::MoE / ai.onnx::Gemm", "moe_experts", supports=_experts_applies)
def _experts_emit(lx, node, h, w13, w2, idx, w):
    """SiLU experts: router logits log(w), the output rescaled by sum(w); SiTU experts: the
    slots sorted by expert, one Gemm per expert."""
    emit = _moe_emit if _moe_applies(node, lx.graph)[0] else _unrolled_emit
    emit(lx, node, h, w13, w2, idx, w)
