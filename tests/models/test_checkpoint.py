"""config.json + safetensors: exact round trips, the official and the HF transformers
layouts, sharded checkpoints, and errors that name what is wrong."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from k3c.models import NAMES, PRESETS, build, from_pretrained, save_pretrained
from k3c.models.checkpoint import CheckpointError, config_from_json, config_to_json
from k3c.models.configs import K3, KIMI_LINEAR

TINY = [n for n in NAMES if n.endswith("-tiny")]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("name", TINY)
def test_round_trip_is_exact(name, tmp_path, ids_for):
    model = build(name, seed=4)
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert_same_weights(loaded, model)
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in model.parameters())
    ids = ids_for(model, 2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_gpt2_head_stays_tied(tmp_path):
    save_pretrained(build("gpt2-tiny"), tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    loaded = from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight


def test_dtype_and_parameter_flags(tmp_path):
    model = build("k3-tiny")
    save_pretrained(model, tmp_path)
    half = from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    loaded = from_pretrained(tmp_path, dtype="float32")
    bias = loaded.model.layers[1].block_sparse_moe.gate.e_score_correction_bias
    assert not bias.requires_grad and not loaded.training


def test_official_layout_on_disk(tmp_path):
    """k3-tiny is written as the K3 release is (K3-SPEC.md section 8.1)."""
    save_pretrained(build("k3-tiny"), tmp_path)
    shapes = {k: tuple(v.shape) for k, v in load_file(tmp_path / "model.safetensors").items()}
    p = "language_model.model.layers.1."
    assert shapes[p + "block_sparse_moe.experts.0.w1.weight"] == (64, 128)
    assert shapes[p + "block_sparse_moe.experts.7.w3.weight"] == (64, 128)
    assert shapes[p + "block_sparse_moe.experts.7.w2.weight"] == (128, 64)
    assert shapes[p + "self_attn.q_conv1d.weight"] == (128, 1, 4)
    assert shapes[p + "self_attn.A_log"] == (32,)  # [head_dim], the 4 heads then zeros
    assert shapes[p + "block_sparse_moe.gate.e_score_correction_bias"] == (8,)
    assert shapes["language_model.model.layers.3.self_attn.kv_a_proj_with_mqa.weight"] == (32 + 16, 256)
    assert shapes["language_model.model.output_attn_res_norm.weight"] == (256,)
    assert shapes["language_model.model.output_attn_res_proj.weight"] == (1, 256)
    assert shapes["language_model.lm_head.weight"] == (1024, 256)
    assert not any("w13" in k or k.endswith("experts.w2") or "model.attn_res" in k for k in shapes)
    assert all(k.startswith("language_model.") for k in shapes)
    wrapper = json.loads((tmp_path / "config.json").read_text())
    assert wrapper["model_type"] == "kimi_k3" and wrapper["architectures"] == ["KimiK3ForConditionalGeneration"]
    cfg = wrapper["text_config"]
    assert cfg["model_type"] == "kimi_linear" and "quantization_config" not in cfg  # dense experts
    assert cfg["linear_attn_config"]["full_attn_layers"] == [4, 8, 9]  # 1-based
    assert cfg["linear_attn_config"]["kda_layers"] == [1, 2, 3, 5, 6, 7]
    assert cfg["hidden_act"] == "situ" and cfg["activation_situ_linear_beta"] == 25.0
    assert cfg["linear_attn_config"]["gate_lower_bound"] == -5.0
    assert cfg["linear_attn_config"]["use_full_rank_gate"] is True
    assert cfg["attn_res_block_size"] == 3 and cfg["mla_use_output_gate"] is True


def test_config_mapping_round_trips_every_preset():
    for name, cfg in PRESETS.items():
        assert config_from_json(json.loads(json.dumps(config_to_json(cfg)))) == cfg, name
    lac = config_to_json(KIMI_LINEAR)["linear_attn_config"]
    assert lac["full_attn_layers"] == [4, 8, 12, 16, 20, 24, 27]
    assert config_to_json(K3)["linear_attn_config"]["full_attn_layers"] == list(range(4, 93, 4)) + [93]


# The released Kimi-Linear-48B-A3B config.json (its architecture fields).
KIMI_LINEAR_RELEASE = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839, "first_k_dense_replace": 1,
    "head_dim": 72, "hidden_act": "silu", "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "kv_lora_rank": 512, "mla_use_nope": True, "model_max_length": 1048576, "moe_intermediate_size": 1024,
    "moe_layer_freq": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_attention_heads": 32,
    "num_expert_group": 1, "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 27,
    "num_key_value_heads": 32, "num_nextn_predict_layers": 0, "num_shared_experts": 1, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "routed_scaling_factor": 2.446, "tie_word_embeddings": False, "topk_group": 1,
    "use_cache": True, "use_grouped_topk": True, "v_head_dim": 128, "vocab_size": 163840,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "short_conv_kernel_size": 4,
    },
}


def test_release_configs_map_to_the_presets():
    assert config_from_json(KIMI_LINEAR_RELEASE) == KIMI_LINEAR
    k3 = {k: v for k, v in config_to_json(K3).items() if k != "model_type"}
    wrapped = {"model_type": "kimi_k3", "text_config": {**k3, "model_type": "kimi_linear"}}
    assert config_from_json(wrapped) == K3


def test_config_errors_name_the_field():
    broken = dict(KIMI_LINEAR_RELEASE)
    del broken["hidden_size"]
    with pytest.raises(CheckpointError, match="'hidden_size'"):
        config_from_json(broken)
    broken = {**KIMI_LINEAR_RELEASE, "linear_attn_config": {"num_heads": 32, "head_dim": 128,
                                                            "short_conv_kernel_size": 4}}
    with pytest.raises(CheckpointError, match="full_attn_layers"):
        config_from_json(broken)
    with pytest.raises(CheckpointError, match="activation_situ_beta"):
        config_from_json({**KIMI_LINEAR_RELEASE, "hidden_act": "situ"})
    with pytest.raises(CheckpointError, match="mla_use_nope"):
        config_from_json({**KIMI_LINEAR_RELEASE, "mla_use_nope": False})
    bad_lists = {**KIMI_LINEAR_RELEASE["linear_attn_config"], "kda_layers": [1, 2, 3]}
    with pytest.raises(CheckpointError, match="partition"):
        config_from_json({**KIMI_LINEAR_RELEASE, "linear_attn_config": bad_lists})
    with pytest.raises(CheckpointError, match="'n_positions'"):
        config_from_json({"k3c_family": "gpt2", "vocab_size": 10})


# ---- the HF transformers kimi_linear layout, written here by an independent mapping ----

def to_hf_layout(model) -> dict[str, torch.Tensor]:
    """Our module's tensors under transformers' KimiLinearForCausalLM names and shapes."""
    out = {}
    for key, t in model.state_dict().items():
        key = key.replace(".block_sparse_moe.", ".mlp.")
        key = re.sub(r"\.self_attn\.(f_a_proj|f_b_proj|dt_bias|A_log)", r".self_attn.forget_gate.\1", key)
        key = key.replace(".experts.w13", ".experts.gate_up_proj").replace(".experts.w2", ".experts.down_proj")
        if key.endswith("forget_gate.A_log"):
            t = t.reshape(1, 1, -1, 1)
        out[key] = t.clone()
    for i in range(model.config.num_layers):
        p = f"model.layers.{i}.self_attn."
        if p + "q_conv1d.weight" in out:
            out[p + "conv1d.weight"] = torch.cat([out.pop(f"{p}{x}_conv1d.weight") for x in "qkv"])
    return out


def hf_config(cfg) -> dict:
    """A config.json as transformers writes it (flat layer types, its own alias names)."""
    return {
        "model_type": "kimi_linear", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.dense_intermediate_size, "moe_intermediate_size": cfg.moe_intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.mla_heads,
        "num_key_value_heads": cfg.mla_heads, "num_shared_experts": cfg.num_shared_experts,
        "routed_scaling_factor": cfg.routed_scaling_factor, "kv_lora_rank": cfg.kv_lora_rank, "q_lora_rank": None,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
        "qk_nope_head_dim": cfg.qk_nope_head_dim, "num_expert_group": 1, "topk_group": 1,
        "num_experts_per_token": cfg.top_k, "moe_renormalize": True, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": False, "num_experts": cfg.num_experts,
        "mlp_layer_types": ["dense"] + ["sparse"] * (cfg.num_layers - 1),
        "layer_types": ["full_attention" if i + 1 in cfg.mla_layers else "linear_attention"
                        for i in range(cfg.num_layers)],
        "linear_head_dim": cfg.kda_head_dim, "linear_num_heads": cfg.kda_heads, "linear_conv_kernel_dim": 4,
        "head_dim": cfg.qk_rope_head_dim,
    }


def write_sharded(tensors: dict[str, torch.Tensor], path: Path, n: int) -> None:
    keys = sorted(tensors)
    weight_map = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in keys[i::n]}
        save_file(part, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_hf_layout_loads(tmp_path, ids_for):
    model = build("kimi-linear-tiny", seed=2)
    save_file(to_hf_layout(model), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(hf_config(model.config)))
    loaded = from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert_same_weights(loaded, model)
    ids = ids_for(model, 2, 13)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_sharded_checkpoints_load(tmp_path, ids_for):
    model = build("kimi-linear-tiny", seed=5)
    write_sharded(to_hf_layout(model), tmp_path, 3)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(model.config)))
    assert_same_weights(from_pretrained(tmp_path), model)

    k3 = build("k3-tiny", seed=5)
    out = tmp_path / "k3"
    save_pretrained(k3, out, max_shard_bytes=1 << 20)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):06d}.safetensors"  # K3: 6 digits
    assert not (out / "model.safetensors").exists()
    assert_same_weights(from_pretrained(out), k3)
    save_pretrained(k3, out)  # a later single-file save replaces the shards
    assert not list(out.glob("model-*.safetensors")) and not (out / "model.safetensors.index.json").exists()
    assert_same_weights(from_pretrained(out), k3)


def test_dense_mlp_saved_under_block_sparse_moe_loads(tmp_path):
    """transformers saves kimi_linear with the dense layer's MLP renamed to block_sparse_moe."""
    model = build("kimi-linear-tiny", seed=6)
    save_pretrained(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for leaf in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"model.layers.0.block_sparse_moe.{leaf}.weight"] = tensors.pop(f"model.layers.0.mlp.{leaf}.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert_same_weights(from_pretrained(tmp_path), model)


@pytest.fixture
def saved_k3(tmp_path):
    save_pretrained(build("k3-tiny", seed=1), tmp_path)
    return tmp_path


def rewrite(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor_is_named(saved_k3):
    rewrite(saved_k3, lambda t: t.pop("language_model.model.layers.2.block_sparse_moe.experts.5.w3.weight"))
    name = r"language_model\.model\.layers\.2\.block_sparse_moe\.experts\.5\.w3\.weight"
    with pytest.raises(CheckpointError, match=r"missing.*" + name):
        from_pretrained(saved_k3)


def test_unexpected_tensor_is_named(saved_k3):
    rewrite(saved_k3, lambda t: t.update({"language_model.model.layers.2.self_attn.surprise": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected.*language_model\.model\.layers\.2\.self_attn\.surprise"):
        from_pretrained(saved_k3)


def test_misshaped_tensor_is_named_with_both_shapes(saved_k3):
    key = "language_model.model.layers.0.self_attn.b_proj.weight"
    rewrite(saved_k3, lambda t: t.update({key: torch.zeros(5, 256)}))
    with pytest.raises(CheckpointError, match=re.escape(key) + r": expected \[4, 256\], got \[5, 256\]"):
        from_pretrained(saved_k3)


def test_all_problems_are_reported_at_once(saved_k3):
    def edit(t):
        t.pop("language_model.lm_head.weight")
        t["language_model.model.norm.weight"] = torch.ones(7)

    rewrite(saved_k3, edit)
    with pytest.raises(CheckpointError) as err:
        from_pretrained(saved_k3)
    assert "lm_head.weight" in str(err.value) and "language_model.model.norm.weight" in str(err.value)


def test_config_that_does_not_fit_the_weights(saved_k3):
    cfg = json.loads((saved_k3 / "config.json").read_text())
    cfg["text_config"]["attn_res_block_size"] = None
    (saved_k3 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\): .*self_attention_res_norm"):
        from_pretrained(saved_k3)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path)
    save_pretrained(build("linear-attn-tiny"), tmp_path, max_shard_bytes=1 << 16)
    next(tmp_path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(FileNotFoundError, match="model-00002"):
        from_pretrained(tmp_path)
