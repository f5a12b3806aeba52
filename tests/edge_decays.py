"""Inputs at the numerical edges of the delta-rule family, shared by every backend's tests,
and the float64 definition they are compared against.

    x = edge_case("spiky", gate="channel")          # an EdgeCase: q, k, v, g, beta, state
    o, S = recurrence_f64(x.q, x.k, x.v, x.g, x.beta, SCALE, x.state)

The edges (each a finding against the chunked forms), T = 64 = one chunk of 64:
- "spiky": kimi-linear's softplus gate with A_log = log 1000 and its input x8 - 8: most steps
  decay by ~0.3, some by hundreds, so chunk cumulative sums reach -1e4 while the decay
  between two later tokens stays small (a difference of large cumsums cancels in fp32);
- "one-step": one step of g = -70 in otherwise weak gates (the same cancellation, once);
- "erased": g = -2 every step and beta = 1e-8, so the start state is erased (e^-128 over the
  chunk) while the new writes are tiny: an e^-30 floor on the decays kept 1e-13 of it, 3e-5
  of the final state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

EDGES = ("spiky", "one-step", "erased")
SCALE = 0.25


@dataclass
class EdgeCase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor  # [B, T, H, K] (channel) or [B, T, H] (head)
    beta: torch.Tensor
    state: torch.Tensor

    def args(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.v, self.g, self.beta, self.state]


def edge_case(edge: str, gate: str = "channel", B: int = 1, T: int = 64, H: int = 2, K: int = 12,
              V: int = 10, seed: int = 5) -> EdgeCase:
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    state = torch.randn(B, H, K, V, generator=gen)
    shape = (B, T, H, K) if gate == "channel" else (B, T, H)
    if edge == "spiky":
        g = -1000.0 * F.softplus(torch.randn(shape, generator=gen) * 8.0 - 8.0)
    elif edge == "one-step":
        g = -0.05 * torch.rand(shape, generator=gen)
        g[:, 5] = -70.0
    elif edge == "erased":
        g, beta = torch.full(shape, -2.0), torch.full(beta.shape, 1e-8)
    else:
        raise ValueError(f"unknown edge {edge!r}")
    return EdgeCase(q, k, v, g, beta, state)


def one_step_case(gate: str = "channel") -> EdgeCase:
    """T = 1: the step of g = -70 of "one-step" alone."""
    x = edge_case("one-step", gate, T=6)
    return EdgeCase(x.q[:, 5:6], x.k[:, 5:6], x.v[:, 5:6], x.g[:, 5:6], x.beta[:, 5:6], x.state)


def recurrence_f64(q, k, v, g, beta, scale: float, S0=None):
    """The delta rule token by token in float64: S = exp(g_t) S (g per channel [B, T, H, K] or
    per head [B, T, H]); S += beta_t k_t (v_t - k_t^T S)^T; o_t = scale q_t^T S.
    Returns (o [B, T, H, V], S [B, H, K, V]), float64."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    if g.dim() == 3:
        g = g[..., None].expand(B, T, H, K)
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64) if S0 is None else S0.double().clone()
    o = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        err = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * err)
        o.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(o, 1), S


def check_edge(o: torch.Tensor, S: torch.Tensor, x: EdgeCase, what: str, scale: float = SCALE) -> None:
    """o and S (fp32) against the float64 recurrence, at the fp32 row of the tolerance table."""
    from k3c.numerics import assert_close

    o_ref, S_ref = recurrence_f64(*x.args()[:5], scale, x.state)
    assert_close(o.double(), o_ref, dtype=torch.float32, what=f"{what} output")
    assert_close(S.double(), S_ref, dtype=torch.float32, what=f"{what} final state")
