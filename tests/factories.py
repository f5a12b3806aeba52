"""The one factory module of the tests: the tiny zoo's names, seeded token ids, and the
prefill/decode lengths the backend suites run the zoo at."""

from __future__ import annotations

import torch

TINY = ["gpt2-tiny", "linear-attn-tiny", "deltanet-tiny", "gated-deltanet-tiny", "kimi-linear-tiny", "k3-tiny"]
CAPTURE_T = 16  # as the CLI captures

# The zoo runs of the ONNX and TVM suites: prefill lengths around the chunk size (1, one short
# of it, two chunks and a tail), a batch of two, and decode steps after a prompt (TVM's prompt
# is shorter: its decode runner is the slower one on a CPU).
PREFILL_T = (1, 63, 130)
BATCH = 2
DECODE_STEPS = 16
ONNX_DECODE_PROMPT = 20
TVM_DECODE_PROMPT = 7


def example_ids(model, B: int, T: int, seed: int = 0) -> torch.Tensor:
    """Token ids [B, T] drawn from the model's vocabulary, reproducible by seed."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=gen)
