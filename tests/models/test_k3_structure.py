"""The K3 and Kimi Linear references are built as K3-SPEC.md describes them: layer kinds,
the MoE (router, latent experts, shared experts), SiTU, and Block AttnRes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from k3c.kernels.situ.naive import situ
from k3c.models import build
from k3c.models.common import GatedMLP
from k3c.models.kda_layer import KDAMixer
from k3c.models.mla_layer import MLAMixer
from k3c.models.moe_layer import MoE
from k3c.numerics import assert_close


@pytest.fixture(scope="module")
def k3():
    return build("k3-tiny", seed=0)


def test_k3_layer_kinds(k3):
    layers = k3.model.layers
    assert len(layers) == 9
    mla = [i + 1 for i, layer in enumerate(layers) if isinstance(layer.self_attn, MLAMixer)]
    kda = [i + 1 for i, layer in enumerate(layers) if isinstance(layer.self_attn, KDAMixer)]
    assert mla == [4, 8, 9]  # 1-based: every 4th plus the double MLA tail
    assert kda == [1, 2, 3, 5, 6, 7]
    for layer in layers:
        attn = layer.self_attn
        if isinstance(attn, KDAMixer):
            assert attn.gate == "sigmoid" and attn.gate_lower_bound == -5.0
            assert hasattr(attn, "g_proj") and not hasattr(attn, "g_a_proj")  # full-rank output gate
            assert tuple(attn.q_conv1d.weight.shape) == (4 * 32, 1, 4)
            assert tuple(attn.A_log.shape) == (4,) and tuple(attn.dt_bias.shape) == (4 * 32,)
        else:
            assert hasattr(attn, "q_a_proj") and hasattr(attn, "g_proj")  # q LoRA, gated output
            assert attn.scale == pytest.approx((32 + 16) ** -0.5)


def test_k3_mlp_layers(k3):
    dense = k3.model.layers[0]
    assert isinstance(dense.mlp, GatedMLP) and not hasattr(dense, "block_sparse_moe")
    assert dense.mlp.gate_proj.out_features == 512 and dense.mlp.act == "situ"
    for layer in k3.model.layers[1:]:
        assert not hasattr(layer, "mlp")
        moe = layer.block_sparse_moe
        assert isinstance(moe, MoE) and moe.top_k == 2
        assert tuple(moe.experts.w13.shape) == (8, 2 * 64, 128)  # experts work in the latent width
        assert tuple(moe.experts.w2.shape) == (8, 128, 64)
        assert tuple(moe.routed_expert_down_proj.weight.shape) == (128, 256)
        assert tuple(moe.routed_expert_up_proj.weight.shape) == (256, 128)
        assert tuple(moe.routed_expert_norm.weight.shape) == (128,)
        assert moe.shared_experts.gate_proj.out_features == 2 * 64  # 2 shared experts, one MLP
        assert moe.act == "situ" and (moe.situ_beta, moe.situ_linear_beta) == (4.0, 25.0)


def test_kimi_linear_structure():
    model = build("kimi-linear-tiny", device="meta")
    mla = [i + 1 for i, layer in enumerate(model.model.layers) if isinstance(layer.self_attn, MLAMixer)]
    assert mla == [4, 6]
    for layer in model.model.layers:
        assert not hasattr(layer, "self_attention_res_proj")
        if isinstance(layer.self_attn, KDAMixer):
            assert layer.self_attn.gate == "softplus" and hasattr(layer.self_attn, "g_a_proj")
        else:
            assert hasattr(layer.self_attn, "q_proj") and not hasattr(layer.self_attn, "g_proj")
    moe = model.model.layers[1].block_sparse_moe
    assert moe.act == "silu" and not hasattr(moe, "routed_expert_down_proj")
    assert moe.scaling == pytest.approx(2.446)


def direct_moe(moe: MoE, x: torch.Tensor, by_biased: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """K3-SPEC.md section 4 written out token by token; returns (y, selected experts)."""
    N = x.shape[0]
    s = torch.sigmoid(x.double() @ moe.gate.weight.double().t())
    choice = s + moe.gate.e_score_correction_bias.double() if by_biased else s
    idx = torch.topk(choice, moe.top_k, dim=-1).indices
    w = s.gather(-1, idx)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * moe.scaling
    h = moe.routed_expert_down_proj(x).double()
    I = moe.I
    y = torch.zeros(N, h.shape[-1], dtype=torch.float64)
    for n in range(N):
        for j in range(moe.top_k):
            e = idx[n, j]
            gate = h[n] @ moe.experts.w13[e, :I].double().t()
            up = h[n] @ moe.experts.w13[e, I:].double().t()
            y[n] += w[n, j] * (situ(gate, up, 4.0, 25.0) @ moe.experts.w2[e].double().t())
    y = moe.routed_expert_norm(y.float())
    return moe.routed_expert_up_proj(y) + moe.shared_experts(x), idx


def test_router_selects_by_biased_and_weights_by_unbiased_scores(ids_for):
    model = build("k3-tiny", seed=0)
    moe = model.model.layers[2].block_sparse_moe
    with torch.no_grad():  # a strong correction, so that the bias decides some choices
        moe.gate.e_score_correction_bias.copy_(0.5 * torch.randn(8, generator=torch.Generator().manual_seed(3)))
    seen = {}
    hook = moe.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model(ids_for(model, 2, 9))
        hook.remove()
        x = seen["x"].reshape(-1, 256)
        want, idx = direct_moe(moe, x)
        unbiased, idx_unbiased = direct_moe(moe, x, by_biased=False)
    assert not torch.equal(idx.sort(-1).values, idx_unbiased.sort(-1).values), "the bias changed no choice"
    assert_close(seen["y"].reshape(-1, 256), want, what="MoE output vs direct recomputation")
    assert (seen["y"].reshape(-1, 256) - unbiased).abs().max() > 1e-3


def test_situ_is_bounded_and_used_by_k3(k3):
    x = torch.cat([torch.linspace(-1e4, 1e4, 2001), torch.tensor([float("inf"), -float("inf")])])
    gate, up = x[:, None].expand(-1, x.numel()), x[None, :].expand(x.numel(), -1)
    out = situ(gate, up, 4.0, 25.0)
    assert torch.isfinite(out[:-2, :-2]).all()
    assert out[:-2, :-2].abs().max() <= 100.0 + 1e-4  # beta * linear_beta
    mlp = k3.model.layers[0].mlp
    h = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)) * 30
    with torch.no_grad():
        want = mlp.down_proj(situ(mlp.gate_proj(h), mlp.up_proj(h), 4.0, 25.0))
        assert_close(mlp(h), want, what="dense MLP vs SiTU")
        assert not torch.allclose(mlp(h), mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)))


def attn_res_reference(model, ids: torch.Tensor) -> torch.Tensor:
    """K3-SPEC.md section 6 written out on the model's own sub-modules."""

    def mix(bank, partial, norm, proj):
        V = torch.stack(bank + [partial]).float()
        keys = V / torch.sqrt(V.pow(2).mean(-1, keepdim=True) + 1e-5)
        scores = (keys * (norm.weight * proj.weight.view(-1))).sum(-1)
        return (torch.softmax(scores, 0)[..., None] * V).sum(0)

    block = model.config.attn_res_block_size
    bank, partial = [], model.model.embed_tokens(ids)
    for i, layer in enumerate(model.model.layers):
        h = partial if not bank else mix(bank, partial, layer.self_attention_res_norm, layer.self_attention_res_proj)
        if i % block == 0:
            bank.append(partial)
            partial = None
        a = layer.self_attn(layer.input_layernorm(h), None)[0]
        partial = a if partial is None else partial + a
        h = mix(bank, partial, layer.mlp_res_norm, layer.mlp_res_proj)
        partial = partial + layer.ffn(layer.post_attention_layernorm(h))
    h = mix(bank, partial, model.model.output_attn_res_norm, model.model.output_attn_res_proj)
    return model.lm_head(model.model.norm(h))


def test_attn_res_follows_the_spec(k3, ids_for):
    ids = ids_for(k3, 2, 11)
    with torch.no_grad():
        assert_close(k3(ids), attn_res_reference(k3, ids), what="AttnRes decoder vs spec")


@pytest.mark.parametrize("query", ["model.layers.4.self_attention_res_proj", "model.layers.7.mlp_res_proj",
                                   "model.output_attn_res_proj"])
def test_changing_a_pseudo_query_changes_the_logits(k3, ids_for, query):
    ids = ids_for(k3, 1, 7)
    other = copy.deepcopy(k3)
    with torch.no_grad():
        other.get_submodule(query).weight.mul_(-3.0)
        before, after = k3(ids), other(ids)
    assert (before - after).abs().max() > 1e-3, f"{query} does not reach the logits"
