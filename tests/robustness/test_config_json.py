"""config.json is checked field by field before anything is built: every value of the wrong
type, outside its range or at odds with another field is one CheckpointError naming the field;
null means unset (HF writes null for the fields it leaves unset)."""

from __future__ import annotations

import copy
import json

import pytest

from k3c.errors import CheckpointError
from k3c.models import from_pretrained
from k3c.models.checkpoint import config_from_json, config_to_json
from k3c.models.configs import PRESETS


def kimi() -> dict:
    return config_to_json(PRESETS["k3-tiny"])


def gpt2() -> dict:
    return config_to_json(PRESETS["gpt2-tiny"])


def edited(base: dict, path: str, value: object) -> dict:
    d = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    node[leaf] = value
    return d


BAD = [
    (kimi, "num_hidden_layers", "9", r"num_hidden_layers = '9' is not int"),
    (kimi, "num_hidden_layers", 9.0, r"num_hidden_layers = 9\.0 is not int"),
    (kimi, "num_hidden_layers", 0, r"num_hidden_layers = 0 must be >= 1"),
    (kimi, "hidden_size", -256, r"hidden_size = -256 is outside \[1, "),
    (kimi, "num_experts_per_token", 9, r"num_experts_per_token = 9 exceeds num_experts = 8"),
    (kimi, "linear_attn_config.full_attn_layers", [4.7, 8, 9], r"full_attn_layers must be a list of layer numbers"),
    (kimi, "linear_attn_config.full_attn_layers", [4, 8, 10], r"full_attn_layers \[4, 8, 10\] must be distinct"),
    (kimi, "linear_attn_config", [1], r"linear_attn_config must be an object"),
    (kimi, "rms_norm_eps", -1e-5, r"rms_norm_eps = -1e-05 must be > 0"),
    (kimi, "rms_norm_eps", float("nan"), r"rms_norm_eps = nan is not a finite number"),
    (kimi, "hidden_act", None, r"missing required field 'hidden_act'"),
    (kimi, "quantization_config", {"config_groups": [1]}, r"quantization_config.config_groups must be an object"),
    (kimi, "quantization_config", {"config_groups": {"g": {"weights": 4}}}, r"config_groups.g.weights must be an"),
    (kimi, "k3c_extra", 3, r"k3c_extra must be an object"),
    (kimi, "mlp_layer_types", "dense", None),  # first_k_dense_replace present: not read
    (gpt2, "n_head", 0, r"n_head = 0 is outside \[1, "),
    (gpt2, "n_head", 3, r"n_head = 3 does not divide n_embd = 128"),
    (gpt2, "n_layer", True, r"n_layer = True is not int"),
    (gpt2, "layer_norm_eps", None, r"missing required field 'layer_norm_eps'"),
]


@pytest.mark.parametrize("base,path,value,message", BAD, ids=[f"{b.__name__}-{p}-{v!r}" for b, p, v, _ in BAD])
def test_a_bad_field_is_named(base, path, value, message):
    d = edited(base(), path, value)
    if message is None:
        config_from_json(d)
        return
    with pytest.raises(CheckpointError, match="config.json: .*" + message):
        config_from_json(d)


@pytest.mark.parametrize("key", ["q_lora_rank", "routed_expert_hidden_size", "attn_res_block_size", "mla_use_nope",
                                 "moe_renormalize", "pad_token_id"])
def test_null_means_unset(key):
    cfg = config_from_json(edited(kimi(), key, None))
    default = config_from_json({k: v for k, v in kimi().items() if k != key})
    assert cfg == default


def test_null_linear_beta_keeps_its_meaning():
    """activation_situ_linear_beta null is SiTU without the linear clamp, as k3c writes it."""
    assert config_from_json(edited(kimi(), "activation_situ_linear_beta", None)).situ_linear_beta is None
    with pytest.raises(CheckpointError, match="missing required field 'activation_situ_beta'"):
        config_from_json(edited(kimi(), "activation_situ_beta", None))


def test_a_config_too_deep_for_json_is_named(tmp_path):
    (tmp_path / "config.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        from_pretrained(tmp_path)


def test_a_model_larger_than_the_memory_is_refused_before_it_is_built(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(edited(gpt2(), "n_layer", 10**9)))
    with pytest.raises(CheckpointError, match=r"a model of 1000000000 layers .* needs at least .* GiB, more than "
                                              r"the .* GiB of memory available"):
        from_pretrained(tmp_path)


def test_one_weight_of_another_floating_dtype_is_named(tmp_path):
    """Once loaded, then `self and mat2 must have the same dtype` in the first forward."""
    from safetensors.torch import load_file, save_file

    from k3c.models import build, save_pretrained

    save_pretrained(build("gpt2-tiny"), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = "transformer.h.0.attn.c_proj.weight"
    tensors[name] = tensors[name].half()
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"{name} is stored as torch.float16, .* other weights as torch.float32"):
        from_pretrained(tmp_path)
    assert from_pretrained(tmp_path, dtype="float32").transformer.h[0].attn.c_proj.weight.dtype.is_floating_point


@pytest.mark.parametrize("override, message", [
    ({"num_layers": -1}, r"k3-tiny: num_layers = -1 is outside \[1, "),
    ({"hidden_size": "8"}, r"k3-tiny: hidden_size = '8' is not int"),
    ({"top_k": 99}, r"k3-tiny: top_k = 99 exceeds num_experts = 8"),
], ids=["negative", "string", "top-k"])
def test_build_overrides_are_checked_before_anything_is_built(override, message):
    from k3c.errors import UsageError
    from k3c.models import build

    with pytest.raises(UsageError, match=message):
        build("k3-tiny", device="meta", **override)
