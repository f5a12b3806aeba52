"""The tiny zoo of the tests: names and seeded example inputs."""

from __future__ import annotations

import torch

TINY = ["gpt2-tiny", "linear-attn-tiny", "deltanet-tiny", "gated-deltanet-tiny", "kimi-linear-tiny", "k3-tiny"]
CAPTURE_T = 16


def example_ids(model, B: int, T: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
