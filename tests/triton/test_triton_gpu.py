"""The Triton kernels compiled for a CUDA GPU (skipped without one): model-sized shapes in
fp32 with 3xTF32 dots (torch's "highest" fp32 matmul precision) against the torch
references, bf16 inputs, autotuning over every config, and k3-tiny end to end.

The other test files of this folder also run compiled on a GPU machine (their inputs live on
the kernels' device); these add what the interpreter cannot show: real tiling, many programs
in flight, bf16 tensor-core dots, the autotuner.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from k3c.numerics import assert_close

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def fp32_dots():
    """fp32 tl.dot at fp32's accuracy, 3xTF32 (the templates follow torch's fp32 matmul precision)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def kda_inputs(B, T, H, K, V, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q, k = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1)
    gate = -5.0 * torch.sigmoid(r(B, T, H, K))  # K3's gate range [-5, 0)
    beta = torch.sigmoid(r(B, T, H))
    return [x.to(dtype) for x in (q, k, r(B, T, H, V), gate, beta)] + [r(B, H, K, V)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunk_kda_at_model_head_dims(dtype):
    from k3c.kernels.delta.triton import chunk_kda
    from k3c.kernels.kda.chunk import chunk_kda as torch_chunk_kda

    q, k, v, g, beta, S0 = kda_inputs(2, 1000, 4, 128, 128, dtype)
    o, S = chunk_kda(q, k, v, g, beta, scale=128**-0.5, initial_state=S0)
    o_ref, S_ref = torch_chunk_kda(*(x.float() for x in (q, k, v, g, beta)), scale=128**-0.5, initial_state=S0)
    assert_close(o.float(), o_ref, dtype=dtype, what="o")
    assert_close(S, S_ref, dtype=dtype, what="final state")


def test_fused_recurrent_decode_step_at_model_head_dims():
    from k3c.kernels.delta.triton import fused_recurrent
    from k3c.kernels.kda.naive import naive_recurrent_kda

    q, k, v, g, beta, S0 = kda_inputs(8, 1, 32, 128, 128, torch.float32)
    o, S = fused_recurrent(q, k, v, g, beta, 0.088, S0, gate="channel")
    o_ref, S_ref = naive_recurrent_kda(q, k, v, g, beta, 0.088, S0)
    assert_close(o, o_ref, what="o")
    assert_close(S, S_ref, what="state")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gemm_templates_at_model_sizes(dtype):
    from k3c.ir import OPS
    from k3c.kernels.moe.triton import moe_experts
    from k3c.kernels.situ.naive import situ
    from k3c.kernels.situ.triton import gated_mlp

    x = torch.randn(300, 1024, device="cuda").to(dtype)
    w = (torch.randn(2 * 768, 1024, device="cuda") / 32).to(dtype)
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    assert_close(gated_mlp(x, w, "situ", 4.0, 25.0).float(), situ(gate, up, 4.0, 25.0), dtype=dtype, what="gated_mlp")

    E, k, I = 16, 4, 256
    idx = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(300)])
    cw = torch.rand(300, k, device="cuda")
    w13 = (torch.randn(E, 2 * I, 1024, device="cuda") / 32).to(dtype)
    w2 = (torch.randn(E, 512, I, device="cuda") / 16).to(dtype)
    ref = OPS["moe_experts"].ref(x.float(), w13.float(), w2.float(), idx, cw, act="situ", beta=4.0, linear_beta=25.0)
    assert_close(moe_experts(x, w13, w2, idx, cw, "situ", 4.0, 25.0).float(), ref, dtype=dtype, what="moe_experts")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_templates_at_model_sizes(dtype):
    from k3c.kernels.attention.naive import causal_attention as attention_ref
    from k3c.kernels.attention.triton import causal_attention
    from k3c.kernels.mla.naive import mla_attention_absorbed as absorbed_ref
    from k3c.kernels.mla.triton import mla_attention_absorbed

    q, kk, v = (torch.randn(2, 300, 8, 128, device="cuda").to(dtype) for _ in range(3))
    assert_close(causal_attention(q, kk, v, 0.088).float(), attention_ref(q.float(), kk.float(), v.float(), 0.088),
                 dtype=dtype, what="causal attention")
    H, Dn, Dr, Dc, Dv = 16, 128, 64, 512, 128
    q = torch.randn(2, 1, H, Dn + Dr, device="cuda").to(dtype)
    ckv, kr = torch.randn(2, 700, Dc, device="cuda").to(dtype), torch.randn(2, 700, Dr, device="cuda").to(dtype)
    w = (torch.randn(H * (Dn + Dv), Dc, device="cuda") / 22).to(dtype)
    wh = w.view(H, Dn + Dv, Dc)
    got = mla_attention_absorbed(q, ckv, kr, wh[:, :Dn], wh[:, Dn:], 192**-0.5)
    ref = absorbed_ref(q.float(), ckv.float(), kr.float(), w.float(), Dv, 192**-0.5)
    assert_close(got.float(), ref, dtype=dtype, what="absorbed MLA decode")


def test_autotune_benchmarks_every_config_and_keeps_the_best():
    from k3c.kernels.delta.triton import chunk_kda
    from k3c.kernels.delta.triton.scan import chunk_state_scan_kernel

    assert len(chunk_state_scan_kernel.configs) > 1
    q, k, v, g, beta, S0 = kda_inputs(1, 512, 2, 64, 64, torch.float32, seed=1)
    first = chunk_kda(q, k, v, g, beta, initial_state=S0)
    assert chunk_state_scan_kernel.best_config is not None
    second = chunk_kda(q, k, v, g, beta, initial_state=S0)  # from the autotune cache
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_k3_tiny_on_the_gpu_equals_eager(zoo, tmp_path):
    import k3c
    from k3c.backends.triton import TritonBackend

    model, prefill, decode = zoo("k3-tiny")
    graphs = {"prefill": k3c.passes.run(prefill, "default"), "decode": k3c.passes.run(decode, "default")}
    backend = TritonBackend()
    backend.lower(graphs, tmp_path)
    runner = backend.load(tmp_path)
    assert runner.device == "cuda"
    ids = torch.randint(0, model.config.vocab_size, (2, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = runner.run("prefill", ids)[0]
        assert_close(logits.cpu(), model.prefill(ids)[0], what="k3-tiny prefill T=300 logits")
