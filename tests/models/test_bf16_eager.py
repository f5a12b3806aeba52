"""Eager in BF16 against fp32 on the same weights and inputs, at the derived BF16_VS_FP32 row.

Whole models only where routing cannot flip (no MoE: the dense ancestors, and Kimi / K3 with
every layer dense); a routing flip on an MoE model moves a token to other experts and its
logits by O(1), so MoE models are checked block by block instead: every token mixer and
every MoE / MLP block of a layer, fed the same (bf16-valued) inputs in both precisions, so
the fp32 router sees identical inputs and picks the same experts.
"""

from __future__ import annotations

import pytest
import torch

from k3c.models import build
from k3c.models.moe_layer import MXFP4Experts
from k3c.models.stats import attn_res_candidates
from k3c.numerics import BF16_VS_FP32, Tolerance, bf16_vs_fp32, rel_rms_err, scaled_max_abs_err


def pair(name: str, **kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model in BF16 with the release's F32 tensors, the same weights in fp32)."""
    bf16 = build(name, seed=1, dtype=torch.bfloat16, **kw)
    fp32 = build(name, seed=1, **kw)
    fp32.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in bf16.state_dict().items()})
    return bf16, fp32


def check(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, what: str) -> None:
    assert actual.dtype == torch.bfloat16, f"{what}: computed in {actual.dtype}, not in the model's bf16"
    rr, mae = rel_rms_err(actual, expected), scaled_max_abs_err(actual, expected)
    assert torch.isfinite(actual).all() and rr <= tol.rel_rms and mae <= tol.max_abs, \
        f"{what}: rel_rms {rr:.2e} (<= {tol.rel_rms:.2e}), scaled max_abs {mae:.2e} (<= {tol.max_abs:.2e})"


def blocks(model: torch.nn.Module) -> int:
    """Blocks in sequence: per layer a token mixer and an MLP, plus every AttnRes mix."""
    cfg = model.config
    n = 2 * getattr(cfg, "num_layers", getattr(cfg, "n_layer", 0))
    if getattr(cfg, "attn_res_block_size", None):
        n += len(attn_res_candidates(cfg.num_layers, cfg.attn_res_block_size))
    return n


DENSE = [("gpt2-tiny", {}), ("linear-attn-tiny", {}), ("deltanet-tiny", {}), ("gated-deltanet-tiny", {}),
         ("kimi-linear-tiny", {"first_k_dense": 6}), ("k3-tiny", {"first_k_dense": 9})]


@pytest.mark.parametrize(("name", "kw"), DENSE, ids=[n for n, _ in DENSE])
def test_dense_models_in_bf16_match_fp32(name, kw, ids_for):
    bf16, fp32 = pair(name, **kw)
    ids = ids_for(fp32, 2, 70)
    with torch.no_grad():
        check(bf16(ids), fp32(ids), bf16_vs_fp32(blocks(fp32)), f"{name} logits")
        lb, sb = bf16.prefill(ids[:, :65])
        lf, sf = fp32.prefill(ids[:, :65])
        for t in range(65, 67):
            lb, sb = bf16.decode(ids[:, t : t + 1], sb)
            lf, sf = fp32.decode(ids[:, t : t + 1], sf)
        check(lb, lf, bf16_vs_fp32(blocks(fp32)), f"{name} decode logits")
    S = [k for k in sb if k.endswith(".S")]
    assert all(sb[k].dtype == torch.float32 for k in S)  # the recurrent state stays fp32


def block_inputs(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(module name, its input) for every layer's token mixer and MLP / MoE, from a run of `model`."""
    caps: list[tuple[str, torch.Tensor]] = []
    hooks = [m.register_forward_pre_hook(lambda _m, args, n=n: caps.append((n, args[0].detach().clone())))
             for n, m in model.named_modules()
             if n.startswith("model.layers.") and n.count(".") == 3 and n.endswith(("self_attn", "mlp", "moe"))]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return caps


@pytest.mark.parametrize(("name", "experts"), [("k3-tiny", None), ("k3-tiny", "mxfp4"), ("kimi-linear-tiny", None)])
def test_every_block_of_an_moe_model_in_bf16_matches_fp32(name, experts, ids_for):
    bf16, fp32 = pair(name, experts=experts)
    ids = ids_for(fp32, 2, 40)
    caps = block_inputs(fp32, ids)
    assert len(caps) == 2 * fp32.config.num_layers
    assert isinstance(bf16.model.layers[1].block_sparse_moe.experts, MXFP4Experts) == (experts == "mxfp4")
    if experts == "mxfp4":  # the token mixers are the dense case's
        caps = [(n, x) for n, x in caps if n.endswith("block_sparse_moe")]
    with torch.no_grad():
        for n, x in caps:
            x = x.to(torch.bfloat16)  # the same inputs in both precisions
            mb, mf = bf16.get_submodule(n), fp32.get_submodule(n)
            if n.endswith("self_attn"):
                got, want = mb(x, None)[0], mf(x.float(), None)[0]
            else:
                got, want = mb(x), mf(x.float())
            check(got, want, BF16_VS_FP32, f"{name} {n}")


def test_attn_res_mix_in_bf16_matches_fp32():
    from k3c.kernels import ops

    gen = torch.Generator().manual_seed(0)
    V = torch.randn(4, 2, 33, 256, generator=gen).to(torch.bfloat16)
    w, n = (torch.randn(256, generator=gen).to(torch.bfloat16) for _ in range(2))
    got = ops.attn_res_mix(V, w, n, 1e-5)
    check(got, ops.attn_res_mix(V.float(), w.float(), n.float(), 1e-5), BF16_VS_FP32, "attn_res_mix")
