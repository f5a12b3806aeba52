"""The `ort` flavour's MXFP4 experts: `moe_experts_mxfp4` as one `com.microsoft::MatMulNBits`
per expert and projection, on an exact re-encoding of the MXFP4 weights as 4-bit integers.

onnxruntime's CPU provider has no float4e2m1 DequantizeLinear; its MatMulNBits takes 2, 4 or
8-bit integers q with a float scale per block of K, w = (q - zero point) * scale. A code's E2M1
value v lies in {0, +-0.5, +-1, +-1.5, +-2, +-3, +-4, +-6}, so with the E8M0 byte e of its group
of 32, w = t * 2^(e - 128) with t = 2v an integer in [-12, 12]:

  - 8 bits hold t as it is (q = 128 + t), but onnxruntime 1.32's CPU kernel for 8 bits with fp32
    activations (accuracy_level 0 or 1) dequantizes the whole weight on every call: 10.5 ms for a
    1024 x 1024 weight and one token, against 0.45 ms for a float32 MatMul (single thread, shared
    machine); its fast 8-bit kernel (accuracy_level 4) quantizes the activations to int8.
  - 4 bits (fp32 activations, a fast kernel: 0.22 ms there) hold 16 levels, t needs 25: so t is
    split as t = a + b, a = clamp(t, -8, 7), b = t - a in [-4, 5], both 4-bit with the default
    zero point 8 and the same scale 2^(e - 128). One MatMulNBits of K' = 2K multiplies
    [x, x] by [W_a | W_b]: sum_k x_k a_k s + sum_k x_k b_k s = x . w.

Every factor is exact in float32 (a, b and t are small integers, s a power of two), so
W_a + W_b is the MXFP4 decode bit for bit (E8M0 255 gives a NaN scale), but for the code of -0,
which becomes +0 (an integer has no signed zero; -0 == +0 in every sum that is not all zeros).
The only rounding is the GEMM's own, over 2K products. (A weight past float32's range, 6 * 2^127
at e = 254, is inf in the decode but two finite halves here; no checkpoint holds one.)

The re-encoding happens at lowering time into initializers: per weight two 4-bit codes and two
4-byte scales per 32, 1.25 bytes against MXFP4's 0.53125 (and float32's 4). accuracy_level 0
keeps the activations fp32.

QMoE (com.microsoft, onnxruntime 1.32) is not used: its CPU kernel refuses a SiTU activation
(K3's experts: "Unsupported MoE activation type"), and for block-wise 8-bit experts it quantizes
the activations to int8 at every accuracy level, which is not the fp32 computation.

The experts are unrolled over the static expert count: the slots sorted by expert (ort.py's
counting sort), [rows, rows] split by the per-expert counts, one MatMulNBits each for gate/up,
the activation once over all slots, again split and one MatMulNBits each for down, the outputs
gathered back to slot order, weighted and summed per token. Per expert and layer only its two
MatMulNBits are nodes; an expert with no slot runs on zero rows.

A decode step (N k <= E, or N = B) takes a third exact form instead: t as int8 blocks
(`int8_blocks`, 1.125 bytes a weight), the routed experts' blocks gathered, one blocked
DequantizeLinear (t * 2^(e - 128), exact) and one batched MatMul per projection. Sixty-four
MatMulNBits nodes a layer (k3-small), most on zero rows, cost more than the four nodes of the
gathered form: 3.10 ms against 1.88 ms for k3-small's twelve gate/up projections at B = 1,
while at B = 8 they are faster (20.2 ms against 25.2 ms; README.md has the measurements).
onnxruntime's MatMulNBits takes the gathered 4-bit codes as a run-time input but was 100x
slower so (197 ms there), and its 8-bit kernel with float32 activations dequantizes the whole
weight per call.
"""

from __future__ import annotations

import torch

from ...ir import Graph, Node, named_inputs
from ...ir import dims as D
from ...kernels.mxfp4.naive import E8M0_NAN, GROUP_SIZE, e2m1_table, unpack_codes
from .builder import MS_DOMAIN, Builder, subgraph
from .functions.mlp import activation, sorted_slots
from .lower import tensor_proto
from .ort import MAX_UNROLLED_EXPERTS, mapping

BITS = 4
ZERO_POINT = 8  # MatMulNBits' default zero point for 4 bits (2^(bits-1)): left out of the graph
ZERO_POINT_8 = 128  # and for 8 bits


def nbits4_pair(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 `packed` [N, K/2] and E8M0 `scale` [N, K/32] (uint8) -> MatMulNBits' B for
    K' = 2K, [N, 2K/32, 16] uint8 (the 4-bit q = 8 + a of the first K, then q = 8 + b; low
    nibble first), and its scales [N, 2K/32] float32 (2^(e - 128), twice)."""
    N, K = packed.shape[0], 2 * packed.shape[1]
    t = (2 * e2m1_table()).to(torch.int32)[unpack_codes(packed).to(torch.int64)]  # 2v in [-12, 12]
    a = t.clamp(-8, 7)
    q = torch.cat([a, t - a], dim=1) + ZERO_POINT  # [N, 2K] in [0, 15]
    q = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
    s = half_scales(scale)
    return q.reshape(N, 2 * K // GROUP_SIZE, GROUP_SIZE // 2), torch.cat([s, s], dim=1)


def half_scales(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes e (uint8, any shape) -> 2^(e - 128) in float32, exactly (255 stays NaN)."""
    e = scale.to(torch.int32)
    # from the bits: e - 1 >= 1 is a normal exponent field, e = 1 is 2^-127 (the subnormal
    # 0x400000), e = 0 is 2^-128 (0x200000)
    bits = torch.where(e >= 2, (e - 1) << 23, torch.where(e == 1, 0x400000, 0x200000))
    return torch.where(e == E8M0_NAN, torch.full_like(e, 0x7FC00000), bits).to(torch.int32).view(torch.float32)


def nbits8(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 `packed` [N, K/2] and E8M0 `scale` [N, K/32] (uint8) -> MatMulNBits' B for
    bits=8, [N, K/32, 32] uint8 (q = 128 + t, t = 2v in [-12, 12], MatMulNBits' default zero
    point 128), and its scales [N, K/32] float32 (2^(e - 128)): 1.125 bytes a weight, the same
    weights as nbits4_pair (and as the MXFP4 decode but for -0, which becomes +0)."""
    N, K = packed.shape[0], 2 * packed.shape[1]
    t = (2 * e2m1_table()).to(torch.int32)[unpack_codes(packed).to(torch.int64)]
    q = (t + ZERO_POINT_8).to(torch.uint8)
    return q.reshape(N, K // GROUP_SIZE, GROUP_SIZE), half_scales(scale)


_PACKED = ("w13_packed", "w13_scale", "w2_packed", "w2_scale")


def _static(*dims) -> bool:
    return all(D.is_static(d) for d in dims)


def _applies(node: Node, g: Graph) -> tuple[bool, str]:
    x = named_inputs(node)
    h, p13, p2 = (g.types[x[n]] for n in ("h", "w13_packed", "w2_packed"))
    if any(x[n] not in g.weights for n in _PACKED):
        return False, "MatMulNBits needs the packed experts as initializers (they are re-encoded)"
    if not _static(*p13.shape, *p2.shape):
        return False, "MatMulNBits needs static expert shapes"
    if int(p13.shape[0]) > MAX_UNROLLED_EXPERTS:
        return False, f"more than {MAX_UNROLLED_EXPERTS} experts: the unrolled graph would be too large"
    if h.dtype != "f32":
        return False, "f32 activations only (MatMulNBits' scales take the activations' dtype)"
    return True, ""


def _initializers(lx, packed: str, scale: str, e: int) -> tuple[str, str]:
    """Expert e's MatMulNBits B and scales, made once per weight and expert."""
    q_name, s_name = f"{packed}.{e}.nbits4x2", f"{scale}.{e}.nbits4x2"
    if q_name not in lx.initializers:
        q, s = nbits4_pair(lx.graph.weights[packed][e], lx.graph.weights[scale][e])
        lx.initializers[q_name], lx.initializers[s_name] = tensor_proto(q_name, q), tensor_proto(s_name, s)
    return q_name, s_name


def _per_expert(lx, b: Builder, rows: str, counts: str, packed: str, scale: str) -> str:
    """rows [M, K] sorted by expert (counts [E] each) through their experts' weights -> [M, N]:
    [rows, rows] split by expert, one MatMulNBits of K' = 2K each, the results concatenated."""
    E, N, half = (int(d) for d in lx.type(packed).shape)
    parts = b.op("Split", [b.Concat(rows, rows, axis=-1), counts], E, axis=0)
    outs = []
    for e, part in enumerate(parts):
        q, s = _initializers(lx, packed, scale, e)
        outs.append(b.op("MatMulNBits", [part, q, s], 1, domain=MS_DOMAIN, K=4 * half, N=N, bits=BITS,
                         block_size=GROUP_SIZE, accuracy_level=0))
    return b.Concat(*outs, axis=0)


def int8_blocks(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 experts `packed` [E, N, K/2] and `scale` [E, N, K/32] (uint8) -> the operands of
    a blocked DequantizeLinear (axis 1, block 32) that yields W^T [E, K, N] in float32: int8
    t = 2v [E, K, N] and the scales 2^(e - 128) [E, K/32, N]. t * 2^(e - 128) is exact, so
    the weights are the MXFP4 decode but for -0, which becomes +0; 1.125 bytes a weight."""
    t = (2 * e2m1_table()).to(torch.int8)[unpack_codes(packed).to(torch.int64)]
    return t.transpose(1, 2).contiguous(), half_scales(scale).transpose(1, 2).contiguous()


def _dq_initializers(lx, packed: str, scale: str) -> tuple[str, str]:
    t_name, s_name = f"{packed}.int8t", f"{scale}.int8t"
    if t_name not in lx.initializers:
        t, s = int8_blocks(lx.graph.weights[packed], lx.graph.weights[scale])
        lx.initializers[t_name], lx.initializers[s_name] = tensor_proto(t_name, t), tensor_proto(s_name, s)
    return t_name, s_name


def _gathered(lx, b: Builder, x: str, slots: str, k: int, packed: str, scale: str) -> str:
    """x [N, k or 1, 1, K] through each slot's expert -> [N, k, 1, N_out]: the routed experts'
    int8 codes and scales gathered, dequantized (exactly) and one batched MatMul."""
    t, s = _dq_initializers(lx, packed, scale)
    E, N_out, half = (int(d) for d in lx.type(packed).shape)
    wt = b.op("DequantizeLinear", [b.Gather(t, slots, axis=0), b.Gather(s, slots, axis=0)], 1, axis=1,
              block_size=GROUP_SIZE)  # [N k, K, N_out] float32
    return b.MatMul(x, b.Reshape(wt, b.ints([-1, k, 2 * half, N_out])))


def _gathered_form(lx, b: Builder, x: dict, h: str, idx: str, w: str, act_args) -> str:
    """Few slots: only the routed experts' weights are read, as int8 blocks -> [N, D_out].
    `x`: the node's inputs by name (IR values); h, idx, w their ONNX names."""
    p13, s13, p2, s2 = (x[n] for n in _PACKED)
    k, D = int(lx.type(x["idx"]).shape[1]), int(lx.type(x["h"]).shape[1])
    slots = b.Reshape(idx, b.ints([-1]))
    gu = _gathered(lx, b, b.Reshape(h, b.ints([-1, 1, 1, D])), slots, k, p13, s13)  # [N, k, 1, 2I]
    out = _gathered(lx, b, activation(b, gu, *act_args), slots, k, p2, s2)  # [N, k, 1, D_out]
    D_out = int(lx.type(p2).shape[1])
    weighted = b.Mul(b.Reshape(out, b.ints([-1, k, D_out])), b.unsqueeze(w, 2))
    return b.ReduceSum(weighted, b.ints([1]), keepdims=0)


def _sorted_form(lx, b: Builder, x: dict, h: str, idx: str, w: str, act_args) -> str:
    """The slots sorted by expert through one MatMulNBits per expert and projection -> [N, D_out]."""
    p13, s13, p2, s2 = (x[n] for n in _PACKED)  # the packed weights: re-encoded, never initializers themselves
    E, k = int(lx.type(p13).shape[0]), int(lx.type(x["idx"]).shape[1])
    counts, dest, perm = sorted_slots(b, idx, E)
    rows = b.Gather(h, b.Div(perm, b.const(k, "i64")), axis=0)  # [N k, D]: each slot's token
    gu = _per_expert(lx, b, rows, counts, p13, s13)  # [N k, 2I] in expert order
    out = _per_expert(lx, b, activation(b, gu, *act_args), counts, p2, s2)  # [N k, D_out]
    per_slot = b.Mul(b.Gather(out, dest, axis=0), b.unsqueeze(b.Reshape(w, b.ints([-1])), 1))
    D_out = int(lx.type(p2).shape[1])
    return b.ReduceSum(b.Reshape(per_slot, b.ints([-1, k, D_out])), b.ints([1]), keepdims=0)


def _few_tokens(lx, x: dict) -> bool:
    """A decode step: N tokens with N k <= E, or (N symbolic) the entry's fact, k3c.ir.decode_step
    (ort.py's rule for SiTU experts)."""
    N, E, k = lx.type(x["h"]).shape[0], lx.type(x["w13_packed"]).shape[0], lx.type(x["idx"]).shape[1]
    return int(N) * int(k) <= int(E) if D.is_static(N) else D.decode_step(lx.graph, x["h"], axis=0)


def _branch(name: str, build) -> object:
    s = Builder(name)
    return subgraph(s, name, [], [(build(s), "f32", 2)])


@mapping("com.microsoft::MatMulNBits / ai.onnx::DequantizeLinear", "moe_experts_mxfp4", supports=_applies)
def _experts_emit(lx, node, **x):
    """Many tokens: the slots sorted by expert through MatMulNBits(w13), the activation once
    over all of them, MatMulNBits(w2): per expert only its two MatMulNBits. A decode step:
    an If on the slot count N k, the gathered int8 form while N k <= E / 2, else the sorted one."""
    h, idx, w = (lx.x(x[n]) for n in ("h", "idx", "w"))
    y = lx.out(node, 0)
    b = lx.b
    E = int(lx.type(x["w13_packed"]).shape[0])
    a = lx.attrs(node)
    beta = linear_beta = None
    if a["act"] != "silu":
        beta = b.param(float(a["beta"]))
        linear_beta = b.param(float(a["linear_beta"])) if a["linear_beta"] is not None else None
    act_args = (a["act"], beta, linear_beta)
    b.domains.add(MS_DOMAIN)
    if not _few_tokens(lx, x):
        b.Identity(_sorted_form(lx, b, x, h, idx, w, act_args), outputs=[y])
        return
    # why E / 2: k3-small at P = 1024 (E = 32), side by side: B = 1 (4 slots)
    # 23.0 ms a step gathered, 37.9 sorted; B = 8 (32 slots) 110 and 88 ms. Per slot the
    # gathered form costs about 3.1 ms more and the sorted 1.8: they cross near 16 slots.
    few = b.squeeze(b.Not(b.Greater(b.ReduceProd(b.Shape(idx), keepdims=1), b.ints([E // 2]))), 0)
    b.op("If", [few], [y], then_branch=_branch("gathered", lambda s: _gathered_form(lx, s, x, h, idx, w, act_args)),
         else_branch=_branch("sorted", lambda s: _sorted_form(lx, s, x, h, idx, w, act_args)))
