"""A tiny checkpoint in the exact layout of the K3 release, written here from K3-SPEC.md
section 8.1 (not by k3c's writer): the `kimi_k3` wrapper config with `quantization_config`
inside `text_config`, every text tensor under `language_model.`, vision tensors beside them,
BF16 with the F32 tensors the spec names, `A_log` padded to `[head_dim]`, routed experts as
MXFP4 `weight_packed` / `weight_scale` only, and shards with a 6-digit total.

`write_release(path)` returns the fp32 weights the checkpoint means (BF16 values widened,
MXFP4 decoded by the test's own decoder), keyed like k3c's k3-tiny state dict.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from test_mxfp4_codec import reference_decode

from k3c.models import build

# K3-SPEC.md 8.1: F32 for KDA A_log, dt_bias, q/k/v_conv1d and o_norm, and the router's bias.
F32 = re.compile(r"self_attn\.(A_log|dt_bias|[qkv]_conv1d\.weight|o_norm\.weight)$|gate\.e_score_correction_bias$")
VISION = {"vision_tower.patch_embed.proj.weight": (64, 3, 4, 4), "vision_tower.blocks.0.attn.qkv.weight": (192, 64),
          "vision_tower.blocks.0.norm1.weight": (64,), "mm_projector.proj.0.weight": (256, 64),
          "mm_projector.proj.0.bias": (256,)}
N_SHARDS = 3


def release_config(cfg) -> dict:
    """config.json of the release for a KimiConfig, field by field as section 8.1 lists them."""
    mla = list(cfg.mla_layers)
    text = {
        "model_type": "kimi_linear", "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps,
        "linear_attn_config": {"num_heads": cfg.kda_heads, "head_dim": cfg.kda_head_dim, "short_conv_kernel_size": 4,
                               "gate_lower_bound": -5.0, "use_full_rank_gate": True, "full_attn_layers": mla,
                               "kda_layers": [i for i in range(1, cfg.num_layers + 1) if i not in mla]},
        "num_attention_heads": cfg.mla_heads, "q_lora_rank": cfg.q_lora_rank, "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim, "mla_use_nope": True, "mla_use_output_gate": True,
        "num_experts": cfg.num_experts, "num_experts_per_token": cfg.top_k, "num_shared_experts": 2,
        "moe_intermediate_size": cfg.moe_intermediate_size, "routed_expert_hidden_size": cfg.routed_expert_hidden_size,
        "latent_moe_use_norm": True, "routed_scaling_factor": 1.0, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "first_k_dense_replace": 1,
        "intermediate_size": cfg.dense_intermediate_size, "hidden_act": "situ", "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0, "attn_res_block_size": cfg.attn_res_block_size,
        "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "bos_token_id": 1, "eos_token_id": 2,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "weights": {"num_bits": 4, "group_size": 32, "type": "float",
                                                      "strategy": "group", "symmetric": True,
                                                      "scale_dtype": "torch.uint8", "observer": "minmax"}}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*lm_head.*", "re:.*vision_tower.*",
                       "re:.*mm_projector.*"]},
    }
    return {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "dtype": "bfloat16",
            "text_config": text, "vision_config": {"model_type": "moonvit", "hidden_size": 64}}


def _mxfp4(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Random codes, and scales that give weights of about 1/sqrt(cols) (fan-in)."""
    packed = rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
    centre = 127 - round(np.log2(np.sqrt(cols) * 2.5))
    return packed, rng.integers(centre - 1, centre + 2, size=(rows, cols // 32), dtype=np.uint8)


def release_tensors(seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], object]:
    """(checkpoint tensors by name, the fp32 weights they mean in k3-tiny's names, config)."""
    model = build("k3-tiny", seed=seed)
    cfg = model.config
    rng = np.random.default_rng(seed)
    ckpt: dict[str, torch.Tensor] = {}
    dense: dict[str, torch.Tensor] = {}
    for key, t in model.state_dict().items():
        name = "language_model." + key
        if key.endswith((".experts.w13", ".experts.w2")):
            p = name.rsplit(".", 1)[0]
            parts = []
            for e in range(t.shape[0]):
                halves = []
                for w in (("w1", "w3") if key.endswith("w13") else ("w2",)):
                    rows, cols = (t.shape[1] // 2, t.shape[2]) if w != "w2" else t.shape[1:]
                    packed, scale = _mxfp4(rng, rows, cols)
                    ckpt[f"{p}.{e}.{w}.weight_packed"] = torch.from_numpy(packed)
                    ckpt[f"{p}.{e}.{w}.weight_scale"] = torch.from_numpy(scale)
                    halves.append(torch.from_numpy(reference_decode(packed, scale)))
                parts.append(torch.cat(halves))
            dense[key] = torch.stack(parts)
        elif key.endswith(".A_log"):
            padded = torch.zeros(cfg.kda_head_dim)  # [head_dim]: the heads, then zeros
            padded[: t.shape[0]] = t
            ckpt[name], dense[key] = padded, t.clone()
        else:
            stored = t.clone() if F32.search(key) else t.to(torch.bfloat16)
            ckpt[name], dense[key] = stored, stored.float()
    gen = torch.Generator().manual_seed(seed)
    for name, shape in VISION.items():
        ckpt[name] = torch.randn(shape, generator=gen).to(torch.bfloat16)
    return ckpt, dense, cfg


def write_release(path: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Write the tiny release checkpoint into `path`; return the fp32 weights it means."""
    ckpt, dense, cfg = release_tensors(seed)
    path.mkdir(parents=True, exist_ok=True)
    names = [f"model-{i + 1:05d}-of-{N_SHARDS:06d}.safetensors" for i in range(N_SHARDS)]
    weight_map = {k: names[i % N_SHARDS] for i, k in enumerate(sorted(ckpt))}
    for name in names:
        part = {k: ckpt[k].contiguous() for k, f in weight_map.items() if f == name}
        save_file(part, str(path / name), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in ckpt.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (path / "config.json").write_text(json.dumps(release_config(cfg), indent=2))
    return dense
