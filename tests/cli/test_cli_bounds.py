"""Requests bounded by what fits, refused in one line before the work: `bench --batch` against
the memory, `generate --max-new-tokens` against the memory even for a model without caches
(its tokens are kept), `k3c.compile(target=...)` against a GPU's launch limits as the CLI's
`--target` is; and `generate` at the smallest capacity that holds its tokens."""

from __future__ import annotations

import pytest
from cli_testlib import fails

import k3c
from k3c.cli import main
from k3c.diff import seeded_ids
from k3c.errors import UsageError
from k3c.generate import EagerRunner, generate


def test_bench_refuses_a_batch_past_the_memory(capsys, monkeypatch):
    monkeypatch.setattr("k3c.resources.available_memory", lambda: 1 << 30)
    monkeypatch.setattr("k3c.bench._bench", lambda *a, **k: pytest.fail("bench ran past the check"))
    fails(["bench", "--model", "gpt2-tiny", "--backends", "reference", "--batch", "100000", "--seq-len", "64"],
          capsys, "bench: batch 100000 x 128 tokens of 1024 logits and their state needs at least")


def test_generate_bounds_the_tokens_of_a_model_without_caches(capsys, monkeypatch):
    """deltanet-tiny holds fixed-size states only; 10^12 new tokens are still 8 TB of ids."""
    monkeypatch.setattr("k3c.resources.available_memory", lambda: 1 << 30)
    fails(["generate", "--model", "deltanet-tiny", "--backend", "eager", "--prompt-ids", "1 2",
           "--max-new-tokens", str(10**12)], capsys, "and their tokens needs at least")


def test_compile_checks_a_targets_launch_limits_before_capture(monkeypatch):
    monkeypatch.setattr("k3c.compiler.capture_entries", lambda *a, **k: pytest.fail("captured before the check"))
    model = k3c.models.build("gpt2-tiny")
    with pytest.raises(UsageError, match="seq_len 1000000000000: .* exceed CUDA's launch limit of 65535 blocks"):
        k3c.compile(model, "triton", (seeded_ids(1024, 1, 4),), target="sm_90", seq_len=10**12)
    with pytest.raises(UsageError, match="seq_len 0: the prefill length of an AOT compile must be an int >= 1"):
        k3c.backends.get("triton", target="sm_90", seq_len=0)


def test_generate_at_the_smallest_capacity_agrees_with_eager(capsys):
    """A prompt of 2 tokens and 2 new ones: caches of 4 rows (the extend entry's capture once
    needed 5 and refused)."""
    assert main(["generate", "--model", "gpt2-tiny", "--backend", "reference", "--prompt-ids", "1 2",
                 "--max-new-tokens", "2"]) == 0
    got = [int(t) for t in capsys.readouterr().out.split()]
    want, _ = generate(EagerRunner(k3c.models.build("gpt2-tiny").eval(), 4), [[1, 2]], 2)
    assert got == want[0]
