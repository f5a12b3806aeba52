"""Bad checkpoints are refused with one CheckpointError that names the file or the tensor,
never read from outside the folder, never loaded as a dtype the model cannot use."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from release_layout import write_release
from safetensors.torch import load_file, save_file

from k3c.models import build, from_pretrained, save_pretrained
from k3c.models.checkpoint import CheckpointError

INDEX = "model.safetensors.index.json"
EXPERT = "language_model.model.layers.1.block_sparse_moe.experts.3"


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("release")
    write_release(path, seed=0)
    return path


@pytest.fixture
def release(release_dir, tmp_path):
    """A fresh copy of the tiny release checkpoint to break."""
    out = tmp_path / "ckpt"
    shutil.copytree(release_dir, out)
    return out


def edit_tensors(path, edit) -> None:
    """Apply `edit(name -> tensor dict)` to each shard of a sharded checkpoint."""
    for f in sorted(path.glob("model-*.safetensors")):
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, str(f), metadata={"format": "pt"})


def edit_index(path, edit) -> None:
    index = json.loads((path / INDEX).read_text())
    edit(index["weight_map"])
    (path / INDEX).write_text(json.dumps(index))


def test_index_entry_outside_the_folder_is_refused(release, tmp_path):
    outside = tmp_path / "outside.safetensors"
    save_file({"secret": torch.zeros(2)}, str(outside))
    edit_index(release, lambda m: m.update({"secret": "../outside.safetensors"}))
    with pytest.raises(CheckpointError, match=r"'secret'.*'\.\./outside\.safetensors'.*outside the checkpoint"):
        from_pretrained(release)
    edit_index(release, lambda m: m.update({"secret": str(outside)}))  # an absolute path
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        from_pretrained(release)


def test_truncated_shard_is_named(release):
    shard = release / "model-00002-of-000003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model-00002-of-000003\.safetensors: not a readable safetensors"):
        from_pretrained(release)


def test_malformed_json_files_are_named(release):
    (release / INDEX).write_text('{"weight_map": {')
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: not valid JSON"):
        from_pretrained(release)
    (release / "config.json").write_text("{'model_type': 'kimi_k3'}")
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        from_pretrained(release)


def test_config_value_of_the_wrong_kind_is_named(release):
    cfg = json.loads((release / "config.json").read_text())
    cfg["text_config"]["hidden_size"] = "256"
    (release / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: hidden_size = '256' is not int"):
        from_pretrained(release)


def test_integer_weight_is_refused(release):
    key = "language_model.model.layers.0.self_attn.b_proj.weight"
    edit_tensors(release, lambda t: t.update({key: t[key].to(torch.int64)}) if key in t else None)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.") + " is I64, needs a floating dtype"):
        from_pretrained(release)


def test_mxfp4_codes_must_be_bytes(release):
    key = EXPERT + ".w2.weight_packed"
    edit_tensors(release, lambda t: t.update({key: t[key].float()}) if key in t else None)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.") + r" is F32, needs U8 \(MXFP4"):
        from_pretrained(release)


def test_missing_scale_is_named(release):
    key = EXPERT + ".w1.weight_scale"
    edit_tensors(release, lambda t: t.pop(key, None))
    edit_index(release, lambda m: m.pop(key))
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): " + key.replace(".", r"\.") + r" \[64, 4\]"):
        from_pretrained(release)


def test_a_log_padding_must_be_zero(release):
    key = "language_model.model.layers.2.self_attn.A_log"

    def edit(t):
        if key in t:
            t[key] = t[key].clone()
            t[key][-1] = 0.5

    edit_tensors(release, edit)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.") + r" \[32\] holds non-zero values past"):
        from_pretrained(release)


def test_other_packed_formats_are_refused(release):
    cfg = json.loads((release / "config.json").read_text())
    cfg["text_config"]["quantization_config"]["format"] = "nvfp4-pack-quantized"
    (release / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="nvfp4-pack-quantized.*is not compressed-tensors 'mxfp4-pack-quantized'"):
        from_pretrained(release)
    cfg["text_config"]["quantization_config"]["format"] = "mxfp4-pack-quantized"
    cfg["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16
    (release / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"group_size.*16.*is not MXFP4"):
        from_pretrained(release)


def test_mixed_dtypes_in_one_module_tensor_are_refused(tmp_path):
    save_pretrained(build("kimi-linear-tiny"), tmp_path)
    key = "model.layers.2.block_sparse_moe.experts.1.w3.weight"
    tensors = load_file(tmp_path / "model.safetensors")
    tensors[key] = tensors[key].to(torch.bfloat16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"experts\.w13 is stored in mixed dtypes \['BF16', 'F32'\]"):
        from_pretrained(tmp_path)
    # a cast on purpose makes them one dtype
    assert from_pretrained(tmp_path, dtype=torch.float32).model.layers[2].block_sparse_moe.experts.w13.dtype \
        == torch.float32
