"""The Kimi Linear 48B-A3B release layout (K3-SPEC.md section 8.2), written by the test: flat
config, names under `model.` and `lm_head.weight`, BF16 with F32 `A_log (1, 1, H, 1)` and
`dt_bias`, per-expert `w1/w2/w3`, `model-000NN-of-00020.safetensors` shards."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from k3c.models import build, from_pretrained, save_pretrained
from k3c.numerics import assert_close

SHARDS = 20


def kl_config(cfg) -> dict:
    mla = list(cfg.mla_layers)
    return {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": 1e-5, "intermediate_size": cfg.dense_intermediate_size, "hidden_act": "silu",
        "num_attention_heads": cfg.mla_heads, "num_key_value_heads": cfg.mla_heads, "q_lora_rank": None,
        "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim, "mla_use_nope": True,
        "num_experts": cfg.num_experts, "num_experts_per_token": cfg.top_k, "num_shared_experts": 1,
        "moe_intermediate_size": cfg.moe_intermediate_size, "routed_scaling_factor": 2.446,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "first_k_dense_replace": 1,
        "num_expert_group": 1, "topk_group": 1, "moe_layer_freq": 1, "tie_word_embeddings": False,
        "linear_attn_config": {"num_heads": cfg.kda_heads, "head_dim": cfg.kda_head_dim, "short_conv_kernel_size": 4,
                               "full_attn_layers": mla,
                               "kda_layers": [i for i in range(1, cfg.num_layers + 1) if i not in mla]},
    }


def write_kimi_linear(path, seed: int = 0) -> dict[str, torch.Tensor]:
    """The tiny release in `path`; returns the fp32 weights it means, in k3c's names."""
    model = build("kimi-linear-tiny", seed=seed)
    ckpt, dense = {}, {}
    for key, t in model.state_dict().items():
        stored = t.clone() if key.endswith(("A_log", "dt_bias")) else t.to(torch.bfloat16)
        dense[key] = stored.float()
        p = key.rsplit(".", 1)[0]
        if key.endswith("experts.w13"):
            I = t.shape[1] // 2
            for e in range(t.shape[0]):
                ckpt[f"{p}.{e}.w1.weight"], ckpt[f"{p}.{e}.w3.weight"] = stored[e, :I], stored[e, I:]
        elif key.endswith("experts.w2"):
            for e in range(t.shape[0]):
                ckpt[f"{p}.{e}.w2.weight"] = stored[e]
        elif key.endswith("A_log"):
            ckpt[key] = stored.reshape(1, 1, -1, 1)
        else:
            ckpt[key] = stored
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    weight_map = {k: names[i % SHARDS] for i, k in enumerate(sorted(ckpt))}
    for name in names:
        save_file({k: ckpt[k].contiguous() for k, f in weight_map.items() if f == name}, str(path / name),
                  metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(kl_config(model.config)))
    return dense


def test_kimi_linear_release_loads_computes_and_writes_back(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    dense = write_kimi_linear(src, seed=2)
    model = from_pretrained(src)
    kda = model.model.layers[0].self_attn
    assert kda.A_log.shape == (4,) and kda.A_log.dtype == kda.dt_bias.dtype == torch.float32
    assert kda.q_conv1d.weight.dtype == model.lm_head.weight.dtype == torch.bfloat16
    assert model.checkpoint_info.skipped == [] and model.checkpoint_info.prefix == ""

    reference = build("kimi-linear-tiny")
    reference.load_state_dict(dense)
    ids = torch.randint(0, 1024, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close(from_pretrained(src, dtype=torch.float32)(ids), reference(ids), torch.float32,
                     what="Kimi Linear release logits")

    save_pretrained(model, out)
    for f in sorted(src.glob("model-*.safetensors")):
        with safe_open(f, framework="pt") as a, safe_open(out / f.name, framework="pt") as b:
            assert set(a.keys()) == set(b.keys()), f.name
            for k in a.keys():
                x, y = a.get_tensor(k), b.get_tensor(k)
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8),
                                                                                 y.view(torch.uint8)), k
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "kimi_linear" and "text_config" not in cfg
