"""Speculative generation gives exactly plain greedy generation's tokens, whatever the draft
accepts: a draft of another model (few drafts accepted, many rollbacks of different lengths
per sequence) and the target as its own draft (every draft accepted, no rollback), eager and
through an artifact's extend; and the CLI's --draft."""

from __future__ import annotations

import subprocess
import sys

import pytest
from serving_testlib import build

import k3c
from k3c.generate import EagerRunner, generate
from k3c.speculative import speculative

PROMPTS = [[5, 9, 17, 3, 200, 7, 1], [44, 2, 9], [301, 5, 77, 8, 8]]


@pytest.fixture(scope="module")
def target():
    return k3c.models.build("k3-tiny").eval()


N, K_MAX = 300, 4  # the check: 300 tokens, batch 3


@pytest.fixture(scope="module")
def greedy(target):
    """Plain greedy generation by the eager target, computed once for every draft below."""
    cap = max(map(len, PROMPTS)) + N + K_MAX
    return generate(EagerRunner(target, cap), PROMPTS, N)[0], cap


# the other family's draft rolls back (the check that matters); the target as its own draft
# (acceptance 1, no rollback) is the slow tier's
@pytest.mark.parametrize("draft_name,k", [("kimi-linear-tiny", 3), pytest.param("k3-tiny", 4, marks=pytest.mark.slow)])
def test_speculative_equals_greedy_eager(target, greedy, draft_name, k):
    want, cap = greedy
    draft = k3c.models.build(draft_name).eval()
    got, stats = speculative(EagerRunner(target, cap), EagerRunner(draft, cap), PROMPTS, N, k=k)
    assert got == want
    if draft_name == "k3-tiny":  # the target drafting for itself: every draft agrees
        assert stats["acceptance"] == 1.0
    else:
        assert stats["accepted"] < stats["drafted"]  # rollbacks did happen


def test_speculative_through_an_artifact(target, fixed_graphs, tmp_path):
    """The target as an ONNX artifact (its extend entry verifies), an eager draft."""
    n, k = 40, 3
    run = build("onnx", fixed_graphs(target), tmp_path)
    want, _ = generate(run, PROMPTS, n)
    got, stats = speculative(run, EagerRunner(k3c.models.build("kimi-linear-tiny").eval(), run.max_context),
                             PROMPTS, n, k=k)
    assert got == want
    assert stats["accepted"] < stats["drafted"]


def test_cli_draft_prints_greedy_tokens():
    args = [sys.executable, "-m", "k3c.cli", "generate", "--model", "k3-tiny", "--backend", "eager",
            "--prompt-ids", "5 9 17", "--max-new-tokens", "12"]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=300)
    spec = subprocess.run(args + ["--draft", "kimi-linear-tiny", "--draft-tokens", "3"], capture_output=True,
                          text=True, timeout=300)
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert "drafts accepted" in spec.stderr
