"""Every model exports once with a dynamic batch and length, keeps each recurrent op as one
node per layer, and the exported program equals eager at another B and T."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.export import Dim, export

from k3c.models import NAMES, build
from k3c.models.configs import GPT2Config, KimiConfig, LinearConfig
from k3c.models.stats import attn_res_candidates
from k3c.numerics import assert_close

TINY = [n for n in NAMES if n.endswith("-tiny")]


def expected_ops(cfg) -> Counter:
    """The torch.ops.k3c.* nodes the model must show: one per layer and op, no unrolling."""
    if isinstance(cfg, GPT2Config):
        return Counter({"causal_attention": cfg.n_layer})
    if isinstance(cfg, LinearConfig):
        L = cfg.num_layers
        if cfg.mixer == "linear_attention":
            return Counter({"linear_attention": L})
        return Counter({{"deltanet": "delta_rule", "gated_deltanet": "gated_delta_rule"}[cfg.mixer]: L,
                        "short_conv": 3 * L})
    assert isinstance(cfg, KimiConfig)
    n_mla = len(cfg.mla_layers)
    n_kda = cfg.num_layers - n_mla
    n_moe = cfg.num_layers - cfg.first_k_dense
    ops = Counter({"kda": n_kda, "short_conv": 3 * n_kda, "mla_attention": n_mla,
                   "moe_gate_up": n_moe, "moe_down": n_moe, "topk": n_moe})  # topk: each router's choice
    if cfg.attn_res_block_size:
        ops["attn_res_mix"] = len(attn_res_candidates(cfg.num_layers, cfg.attn_res_block_size))
    return ops


def k3c_ops(ep) -> Counter:
    found = Counter()
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target.namespace == "k3c":
                found[node.target._opname] += 1
    return found


@pytest.mark.parametrize("name", TINY)
def test_export_dynamic_batch_and_length(name, ids_for):
    model = build(name, seed=0)
    B, T = Dim("B", min=1, max=64), Dim("T", min=1, max=512)
    ep = export(model, (ids_for(model, 2, 17),), dynamic_shapes=({0: B, 1: T},))
    assert k3c_ops(ep) == expected_ops(model.config)
    for b, t in [(3, 70), (1, 1)]:
        ids = ids_for(model, b, t, seed=5)
        with torch.no_grad():
            got, want = ep.module()(ids), model(ids)
        assert_close(got, want, what=f"{name} exported vs eager at B={b}, T={t}")
