"""Every model of the zoo builds, and its weights are a function of the seed alone."""

from __future__ import annotations

import pytest
import torch

from k3c.models import FULL_SIZE, NAMES, build

TINY = [n for n in NAMES if n.endswith("-tiny")]


def test_the_zoo_has_the_models_of_the_article():
    assert set(TINY) == {"gpt2-tiny", "linear-attn-tiny", "deltanet-tiny", "gated-deltanet-tiny",
                         "kimi-linear-tiny", "k3-tiny"}
    assert FULL_SIZE == {"gpt2", "kimi-linear", "k3"}


@pytest.mark.parametrize("name", TINY)
def test_same_seed_same_weights_other_seed_other_weights(name):
    torch.manual_seed(1)
    a = build(name, seed=0).state_dict()
    torch.manual_seed(2)  # the global RNG must not matter
    b = build(name, seed=0).state_dict()
    c = build(name, seed=1).state_dict()
    assert a.keys() == b.keys() == c.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{name}: {k} differs between two builds with seed 0"
    same = [k for k in a if a[k].numel() > 1 and torch.equal(a[k], c[k])]
    assert not same, f"{name}: seeds 0 and 1 give identical {same}"


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_run(name, ids_for):
    model = build(name)
    ids = ids_for(model, 2, 5)
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == (2, 5, model.config.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", sorted(FULL_SIZE) + ["k3-small"])
def test_full_size_builds_on_meta(name):
    model = build(name, device="meta")
    assert all(p.is_meta for p in model.parameters())
    with torch.device("meta"):
        logits = model(torch.zeros(1, 3, dtype=torch.long))
    assert logits.shape == (1, 3, model.config.vocab_size)
