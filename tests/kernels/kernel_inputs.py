"""The one input factory of the kernel tests: seeded tensors shaped like the models feed them.

Delta-rule inputs: q, k l2-normalised over K (as the KDA / DeltaNet layers do), K != V so a
transposed state cannot pass, B = H = 2. Linear attention gets positive feature maps (elu + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

B, H, K, V = 2, 2, 32, 48


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=generator(seed))


@dataclass
class DeltaInputs:
    q: torch.Tensor  # [B, T, H, K]
    k: torch.Tensor  # [B, T, H, K]
    v: torch.Tensor  # [B, T, H, V]
    g: torch.Tensor | None  # [B, T, H, K] (channel), [B, T, H] (head) or None
    beta: torch.Tensor  # [B, T, H]
    state: torch.Tensor | None  # [B, H, K, V] fp32 or None

    def sliced(self, start: int, stop: int) -> DeltaInputs:
        """The same inputs restricted to time steps [start, stop), without the state."""
        cut = lambda x: None if x is None else x[:, start:stop]
        return DeltaInputs(cut(self.q), cut(self.k), cut(self.v), cut(self.g), cut(self.beta), None)


def delta_inputs(T: int, *, gate: str | None = "channel", with_state: bool = False, seed: int = 0,
                 g: torch.Tensor | None = None) -> DeltaInputs:
    """q, k, v, g, beta (and an initial state) for KDA (gate "channel"), the gated delta rule
    ("head") or the delta rule (None). Gates are log-decays <= 0 with a spread of strengths;
    pass `g` to choose them."""
    gen = generator(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    if g is None and gate is not None:
        shape = (B, T, H, K) if gate == "channel" else (B, T, H)
        g = F.logsigmoid(2.0 + 2.0 * torch.randn(*shape, generator=gen))
    state = torch.randn(B, H, K, V, generator=gen) if with_state else None
    return DeltaInputs(q, k, v, g, beta, state)


def linear_inputs(T: int, *, with_state: bool = False, seed: int = 0):
    """(q, k, v, (S, z) or None) for normalised linear attention: phi = elu + 1 > 0, and a
    state that a positive history could have left (S from positive keys, z > 0)."""
    gen = generator(seed)
    q = F.elu(torch.randn(B, T, H, K, generator=gen)) + 1
    k = F.elu(torch.randn(B, T, H, K, generator=gen)) + 1
    v = torch.randn(B, T, H, V, generator=gen)
    state = None
    if with_state:
        k0 = F.elu(torch.randn(B, 8, H, K, generator=gen)) + 1
        v0 = torch.randn(B, 8, H, V, generator=gen)
        state = (torch.einsum("bthk,bthv->bhkv", k0, v0), k0.sum(1))
    return q, k, v, state


def kda_strong_gates(T: int, *, mixed: bool, seed: int = 0) -> torch.Tensor:
    """KDA gates at K3's lower bound -5 (every step, every channel), or a random mix near it."""
    if not mixed:
        return torch.full((B, T, H, K), -5.0)
    return -5.0 + 0.5 * torch.rand(B, T, H, K, generator=generator(seed))
