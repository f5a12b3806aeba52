"""Shared pieces of the model-zoo tests: one factory for token ids."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def ids_for():
    """ids_for(model, B, T, seed=0) -> int64 input_ids [B, T] in the model's vocabulary."""

    def make(model, B: int, T: int, seed: int = 0) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, model.config.vocab_size, (B, T), generator=gen)

    return make
