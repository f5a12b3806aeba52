"""Storage precision of a model: the releases' dtype policies, MXFP4 experts, bytes held.

The K3 release (K3-SPEC.md section 8.1) stores BF16 weights except a few tensors kept in F32
(the KDA `A_log`, `dt_bias`, the three short convs, `o_norm`, and the router's
`e_score_correction_bias`), and its routed experts as MXFP4; the Kimi Linear release (8.2)
is BF16 with F32 `A_log` and `dt_bias`. `to_release_dtypes` gives a model its family's
policy in any floating dtype; `release_precision` says how each family was released;
`quantize_experts` turns dense routed experts into MXFP4 ones (`kernels/mxfp4.encode`),
`dequantize_experts` back. `bf16_policy` is the eager definition of the BF16 compute policy
(`k3c.compile(..., compute="bf16")`) and `BF16State` that of the BF16 recurrent state
(`state_dtype="bf16"`), each written apart from the compiler's pass so each checks the other.
"""

from __future__ import annotations

import re
import types
from collections import Counter

import torch
import torch.nn as nn

from ..kernels.mxfp4 import decode, encode
from .common import GatedMLP
from .configs import KimiConfig, kimi_model_type
from .moe_layer import Experts, MoE, MXFP4Experts

# Tensors a release keeps in F32 whatever the model's dtype (state-dict names), per family.
K3_F32 = re.compile(
    r"\.self_attn\.(A_log|dt_bias|[qkv]_conv1d\.weight|o_norm\.weight)$|\.gate\.e_score_correction_bias$")
KIMI_LINEAR_F32 = re.compile(r"\.self_attn\.(A_log|dt_bias)$")


def f32_tensors(cfg: object) -> re.Pattern | None:
    """The names the release of `cfg`'s family keeps in F32 (None: no such tensors)."""
    if not isinstance(cfg, KimiConfig):
        return None
    return K3_F32 if kimi_model_type(cfg) == "kimi_k3" else KIMI_LINEAR_F32


def release_precision(cfg: object) -> dict:
    """How the family of `cfg` is released: `build` arguments (`dtype`, `experts`).

    K3: BF16 (+ its F32 tensors) with MXFP4 routed experts; Kimi Linear: BF16 (+ F32 A_log,
    dt_bias); GPT-2: F32 (its release); the linear-attention ancestors have no release: F32.
    """
    if isinstance(cfg, KimiConfig):
        k3 = kimi_model_type(cfg) == "kimi_k3"
        return {"dtype": torch.bfloat16, "experts": "mxfp4" if k3 else None}
    return {"dtype": torch.float32, "experts": None}


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """A torch dtype from a dtype or its name ("bfloat16", "torch.float32"); None stays None."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


@torch.no_grad()
def to_release_dtypes(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast the floating parameters and buffers to `dtype`, except those the release of the
    model's family keeps in F32 (`f32_tensors`)."""
    if not dtype.is_floating_point:
        raise ValueError(f"a model's dtype must be a floating dtype, got {dtype}")
    keep = f32_tensors(model.config)
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point():
            t.data = t.data.to(torch.float32 if keep is not None and keep.search(name) else dtype)
    return model


def moe_blocks(model: nn.Module) -> list[tuple[str, MoE]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]


@torch.no_grad()
def quantize_experts(model: nn.Module) -> nn.Module:
    """Replace every dense `Experts` by `MXFP4Experts` holding its MXFP4 encoding."""
    blocks = moe_blocks(model)
    if not blocks:
        raise ValueError(f"{getattr(model, 'name', type(model).__name__)} has no routed experts to quantize")
    for _, moe in blocks:
        ex = moe.experts
        if isinstance(ex, MXFP4Experts):
            continue
        E, two_i, D = ex.w13.shape
        with torch.device(ex.w13.device):
            q = MXFP4Experts(E, D, two_i // 2)
        if ex.w13.device.type != "meta":
            q.w13_packed.data, q.w13_scale.data = encode(ex.w13)
            q.w2_packed.data, q.w2_scale.data = encode(ex.w2)
        moe.experts = q
    return model


@torch.no_grad()
def dequantize_experts(model: nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Replace every `MXFP4Experts` by dense `Experts` holding its decoded weights in `dtype`."""
    for _, moe in moe_blocks(model):
        ex = moe.experts
        if not isinstance(ex, MXFP4Experts):
            continue
        E, two_i, half_d = ex.w13_packed.shape
        with torch.device(ex.w13_packed.device):
            dense = Experts(E, 2 * half_d, two_i // 2)
        dense.w13.data = decode(ex.w13_packed, ex.w13_scale, dtype)
        dense.w2.data = decode(ex.w2_packed, ex.w2_scale, dtype)
        moe.experts = dense
    return model


def low_precision(model: nn.Module) -> bool:
    """The model holds floating weights narrower than float32 (a BF16 release)."""
    return any(t.is_floating_point() and t.dtype.itemsize < 4 for t in [*model.parameters(), *model.buffers()])


def fp32_copy(model: nn.Module) -> nn.Module:
    """The same model in float32 on the same weights: each BF16 value widened, each MXFP4
    expert decoded exactly. What a float32 computation from the stored weights must match."""
    import copy

    out = dequantize_experts(copy.deepcopy(model)).float()
    out.name = getattr(model, "name", type(model).__name__)
    return out


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to BF16 (to nearest, ties to even) and held in its own dtype again."""
    return x.to(torch.bfloat16).to(x.dtype)


def _round_input(module: nn.Module, args: tuple) -> tuple:
    return (round_bf16(args[0]), *args[1:])


def _round_output(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return round_bf16(out)


def _routed_bf16(self: MoE, h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return MoE.routed(self, round_bf16(h), idx, w)


def bf16_gemm_inputs(model: nn.Module) -> list[str]:
    """The GEMMs `model` (held in BF16) runs on BF16 operands, by module name: every nn.Linear
    whose weight is BF16 (F.linear needs its operands in one dtype, so its input is BF16 too),
    and the routed experts (`NAME.experts`) of an MoE whose input to them is BF16. The router
    is not one: the model computes its logits from float32 operands (models/moe_layer.py)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and m.weight.dtype == torch.bfloat16:
            out.append(name)
        elif isinstance(m, MoE):
            feeds = m.routed_expert_down_proj.weight if hasattr(m, "routed_expert_down_proj") else m.gate.weight
            if feeds.dtype == torch.bfloat16:  # the experts read the latent projection's output, or x itself
                out.append(f"{name}.experts")
    return out


def bf16_policy(model: nn.Module, dtype: torch.dtype = torch.float32, bf16_outputs: bool = False) -> nn.Module:
    """The BF16 compute policy in eager PyTorch: `model` (held in BF16) on its own weights in
    `dtype` (fp32_copy: BF16 widened, MXFP4 decoded), with the input of every GEMM it runs on
    BF16 operands (`bf16_gemm_inputs`) rounded to BF16; accumulation, outputs and everything
    else in `dtype` (norms, the router and top-k, the recurrences and attention, the residual
    sum). The routed experts' hidden (the activation between an expert's two GEMMs) stays in
    `dtype`, as the fused expert op holds it (passes/compute_dtype.py says why).

    `dtype=torch.float64` is the policy's exact evaluation: the same roundings to BF16, the
    rest in float64; what the float32 one is measured against (k3c.numerics.BF16_COMPUTE).

    `bf16_outputs=True` is the form of a runtime whose BF16 GEMM returns a BF16 product
    (onnxruntime's CUDA MatMul; passes/bf16_reads.py): each such nn.Linear's output is rounded
    to BF16 too, except a gated MLP's gate and up projections, whose product the fused op
    (`gated_mlp`) holds inside in `dtype`, as the routed experts hold theirs."""
    if not low_precision(model):
        raise ValueError(f"{getattr(model, 'name', type(model).__name__)} holds no BF16 weights: "
                         "the BF16 compute policy has nothing to round")
    names = set(bf16_gemm_inputs(model))
    out = fp32_copy(model).to(dtype)
    for name, m in out.named_modules():
        if isinstance(m, nn.Linear) and name in names:
            m.register_forward_pre_hook(_round_input)
        elif isinstance(m, MoE) and f"{name}.experts" in names:
            m.routed = types.MethodType(_routed_bf16, m)  # a bound method: deepcopy rebinds it
    out.compute_policy, out.bf16_gemms = "bf16", sorted(names)
    return _round_outputs(out) if bf16_outputs else out


def with_bf16_outputs(policy: nn.Module) -> nn.Module:
    """A copy of the eager policy `policy` (bf16_policy) in its `bf16_outputs=True` form."""
    import copy

    return _round_outputs(copy.deepcopy(policy))


def _round_outputs(policy: nn.Module) -> nn.Module:
    inside = {f"{name}.{p}" for name, m in policy.named_modules() if isinstance(m, GatedMLP)
              for p in ("gate_proj", "up_proj")}
    for name, m in policy.named_modules():
        if isinstance(m, nn.Linear) and name in policy.bf16_gemms and name not in inside:
            m.register_forward_hook(_round_output)
    policy.compute_policy = "bf16-outputs"
    return policy


class BF16State:
    """The BF16 recurrent-state policy in eager PyTorch (`k3c.compile(..., state_dtype="bf16")`):
    `model`'s prefill, extend and decode, with every recurrent state entry (floating, float32
    or wider, and of a shape that does not grow with the context: a KDA or delta-rule state,
    the conv tails; models.validate.state_spec) rounded to BF16 when a call returns it and
    widened to the dtype the model computes it in when the next call takes it. Caches and
    positions pass as they are. Written from the model's own state spec, apart from the
    compiler's pass (passes/state_dtype.py), so each checks the other. On a float64 copy of
    the model it is the policy's exact evaluation (k3c.numerics.BF16_STATE)."""

    def __init__(self, model: nn.Module):
        from .validate import state_spec

        self.model, self.config = model, model.config
        self.name = getattr(model, "name", type(model).__name__)
        self.widen = {k: dt for k, (_, grows, dt) in state_spec(model).items()
                      if dt.is_floating_point and dt.itemsize >= 4 and not grows}

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)  # no state crosses a call

    def _rounded(self, state: dict) -> dict:
        return {k: v.to(torch.bfloat16) if k in self.widen else v for k, v in state.items()}

    def _widened(self, state: dict) -> dict:
        return {k: v.to(self.widen[k]) if k in self.widen else v for k, v in state.items()}

    def prefill(self, input_ids: torch.Tensor, lengths=None, logits: str = "all", max_context: int | None = None,
                chunk: int | None = None) -> tuple[torch.Tensor, dict]:
        if chunk is not None and chunk < input_ids.shape[-1]:  # pieces: rounded between them too
            from .extend import prefill_chunked

            return prefill_chunked(lambda ids, n: self.prefill(ids, n, max_context=max_context),
                                   lambda ids, st, n: self.extend(ids, st, n), input_ids, chunk, lengths, logits)
        out, state = self.model.prefill(input_ids, lengths, logits, max_context)
        return out, self._rounded(state)

    def extend(self, input_ids: torch.Tensor, state: dict, lengths=None,
               logits: str = "all") -> tuple[torch.Tensor, dict]:
        out, state = self.model.extend(input_ids, self._widened(state), lengths, logits)
        return out, self._rounded(state)

    def decode(self, input_ids: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        out, state = self.model.decode(input_ids, self._widened(state))
        return out, self._rounded(state)


def unique_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with tied tensors once (GPT-2's lm_head is its embedding)."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            out[name] = t
    return out


def bytes_by_dtype(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Bytes of `tensors` per dtype name ("bfloat16", "uint8", ...), largest first."""
    count: Counter[str] = Counter()
    for t in tensors.values():
        count[str(t.dtype).removeprefix("torch.")] += t.numel() * t.element_size()
    return dict(count.most_common())


__all__ = ["K3_F32", "KIMI_LINEAR_F32", "f32_tensors", "release_precision", "as_dtype", "to_release_dtypes",
           "quantize_experts", "dequantize_experts", "unique_tensors", "round_bf16",
           "bf16_gemm_inputs", "bf16_policy", "BF16State", "bytes_by_dtype", "moe_blocks"]
