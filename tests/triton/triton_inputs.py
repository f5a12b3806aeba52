"""The one input factory of the Triton tests: seeded tensors shaped like the models feed them,
at tiny awkward sizes (the interpreter is slow), in the dtype under test, on the device the
kernels run on (the CPU under TRITON_INTERPRET=1, else the GPU; references run there too).

Delta-rule inputs: q, k l2-normalised over K, beta in (0, 1), log-decays g <= 0 with a spread
of strengths; K != V unless asked, B = H = 2 so batch and head offsets are exercised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from k3c.kernels.common.triton import DEVICE

B, H = 2, 2
LENGTHS = [1, 63, 65]
HEAD_DIMS = [32, 48]
DTYPES = [torch.float32, torch.float16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=gen(seed))).to(DEVICE, dtype)


@dataclass
class Delta:
    q: torch.Tensor  # [B, T, H, K]
    k: torch.Tensor  # [B, T, H, K]
    v: torch.Tensor  # [B, T, H, V]
    g: torch.Tensor | None  # [B, T, H, K] (channel), [B, T, H] (head), None
    beta: torch.Tensor  # [B, T, H]
    state: torch.Tensor  # [B, H, K, V] fp32

    def upcast(self) -> Delta:
        """The same values in fp32: what the reference sees of 16-bit inputs."""
        f = lambda x: None if x is None else x.float()
        return Delta(f(self.q), f(self.k), f(self.v), f(self.g), f(self.beta), self.state)

    def cut(self, start: int, stop: int, state: torch.Tensor) -> Delta:
        c = lambda x: None if x is None else x[:, start:stop]
        return Delta(c(self.q), c(self.k), c(self.v), c(self.g), c(self.beta), state)


def delta(T: int, K: int = 32, V: int | None = None, *, gate: str = "channel", dtype: torch.dtype = torch.float32,
          seed: int = 0, strong: bool = False) -> Delta:
    """KDA (gate "channel"), gated delta rule ("head") or delta rule ("none") inputs.
    strong: gates at K3's lower bound -5 and below (every step decays by e^-5 or more)."""
    V = K + 16 if V is None else V
    g_ = gen(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=g_), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=g_), dim=-1)
    v = torch.randn(B, T, H, V, generator=g_)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g_))
    g = None
    if gate != "none":
        shape = (B, T, H, K) if gate == "channel" else (B, T, H)
        g = (-5.0 - 20.0 * torch.rand(*shape, generator=g_)) if strong else \
            F.logsigmoid(2.0 + 2.0 * torch.randn(*shape, generator=g_))
    state = torch.randn(B, H, K, V, generator=g_).to(DEVICE)
    cast = lambda x: None if x is None else x.to(DEVICE, dtype)
    return Delta(cast(q), cast(k), cast(v), cast(g), cast(beta), state)
