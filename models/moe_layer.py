"""The MoE block: sigmoid router with bias correction, shared experts, latent experts
(K3-SPEC.md section 4). Every shape is static: routing yields top-k indices and weights,
and the expert GEMMs take the indices (`torch.ops.k3c.moe_gate_up` / `moe_down`).

    s = sigmoid(x W_r^T) (fp32);  idx = topk(s + bias, k);  w = s[idx] / sum * scaling
    h = routed_expert_down_proj(x)                       (latent, when configured)
    y = sum_k w_k * w2_k(act(w1_k h, w3_k h))
    y = routed_expert_up_proj(rmsnorm(y))                (latent, norm when configured)
    y = y + shared_experts(x)                            one MLP of width I * n_shared
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..kernels import ops
from .common import BETA, LINEAR_BETA, GatedMLP, RMSNorm, activate


class Router(nn.Module):
    def __init__(self, d: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, d))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts), requires_grad=False)


class Experts(nn.Module):
    """The routed experts, packed: w13 [E, 2I, D] (w1 rows first, then w3) and w2 [E, D, I].

    Checkpoints hold them per expert (`experts.{e}.w1/w2/w3`); the loader packs them.
    """

    def __init__(self, num_experts: int, dim: int, hidden: int):
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))

    def num_weights(self) -> int:
        return self.w13.numel() + self.w2.numel()


class MXFP4Experts(nn.Module):
    """The routed experts as the K3 release stores them: MXFP4 codes and E8M0 scales
    (`kernels/mxfp4`), packed like `Experts` (w1 rows, then w3), decoded per expert on the fly.

        w13_packed [E, 2I, D/2] u8   w13_scale [E, 2I, D/32] u8
        w2_packed  [E, D, I/2]  u8   w2_scale  [E, D, I/32]  u8

    The tensors are frozen parameters, so `parameters()` lists every weight a model holds.
    """

    def __init__(self, num_experts: int, dim: int, hidden: int):
        super().__init__()
        for k in (dim, hidden):
            if k % 32:
                raise ValueError(f"MXFP4 experts need their input dims to be multiples of 32, got {dim} and {hidden}")
        E = num_experts

        def frozen(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(*shape, dtype=torch.uint8), requires_grad=False)

        self.w13_packed, self.w13_scale = frozen(E, 2 * hidden, dim // 2), frozen(E, 2 * hidden, dim // 32)
        self.w2_packed, self.w2_scale = frozen(E, dim, hidden // 2), frozen(E, dim, hidden // 32)

    def num_weights(self) -> int:
        return 2 * (self.w13_packed.numel() + self.w2_packed.numel())


class MoE(nn.Module):
    def __init__(self, d: int, num_experts: int, top_k: int, intermediate: int,
                 num_shared: int, routed_scaling_factor: float, renormalize: bool = True,
                 latent_dim: int | None = None, latent_norm: bool = False, act: str = "situ",
                 situ_beta: float = BETA, situ_linear_beta: float | None = LINEAR_BETA,
                 norm_eps: float = 1e-5):
        super().__init__()
        self.top_k, self.scaling, self.renormalize = top_k, routed_scaling_factor, renormalize
        self.I = intermediate
        self.act, self.situ_beta, self.situ_linear_beta = act, situ_beta, situ_linear_beta
        self.gate = Router(d, num_experts)
        expert_dim = latent_dim or d
        if latent_dim is not None:
            self.routed_expert_down_proj = nn.Linear(d, latent_dim, bias=False)
            self.routed_expert_up_proj = nn.Linear(latent_dim, d, bias=False)
            if latent_norm:
                self.routed_expert_norm = RMSNorm(latent_dim, norm_eps)
        self.experts = Experts(num_experts, expert_dim, intermediate)
        if num_shared:
            self.shared_experts = GatedMLP(d, intermediate * num_shared, act, situ_beta,
                                           situ_linear_beta)

    def route(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [N, d] -> (expert ids [N, k], combine weights [N, k]): sigmoid scores, top-k on
        the scores plus the correction bias (ties: the lower index), optionally renormalised."""
        s = torch.sigmoid(F.linear(x2.float(), self.gate.weight.float()))
        idx = ops.topk(s + self.gate.e_score_correction_bias.float(), self.top_k, -1)[1]  # ties: lower index
        w = s.gather(-1, idx)
        if self.renormalize:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scaling

    def routed(self, h: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The routed experts on h [N, width]: each slot's expert, weighted and summed per token."""
        ex = self.experts
        if isinstance(ex, MXFP4Experts):
            gu = ops.moe_gate_up_mxfp4(h, ex.w13_packed, ex.w13_scale, idx)
        else:
            gu = ops.moe_gate_up(h, ex.w13, idx)
        a = activate(gu[..., : self.I], gu[..., self.I :], self.act, self.situ_beta,
                     self.situ_linear_beta)
        if isinstance(ex, MXFP4Experts):
            return ops.moe_down_mxfp4(a, ex.w2_packed, ex.w2_scale, idx, w)
        return ops.moe_down(a, ex.w2, idx, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        x2 = x.reshape(B * T, d)
        idx, w = self.route(x2)
        h = self.routed_expert_down_proj(x2) if hasattr(self, "routed_expert_down_proj") else x2
        y = self.routed(h, idx, w)
        if hasattr(self, "routed_expert_norm"):
            y = self.routed_expert_norm(y)
        if hasattr(self, "routed_expert_up_proj"):
            y = self.routed_expert_up_proj(y)
        if hasattr(self, "shared_experts"):
            y = y + self.shared_experts(x2)
        return y.view(B, T, d)
