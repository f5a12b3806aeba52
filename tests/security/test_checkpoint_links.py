"""A checkpoint folder is read from inside itself: a config.json or model.safetensors that is a
link to a file elsewhere was followed, and a stale model.safetensors beside an index was loaded
instead of the shards the index names."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from k3c.models import build, from_pretrained, save_pretrained
from k3c.models.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """gpt2-tiny as one model.safetensors, and as shards with an index (seed 1: other weights)."""
    root = tmp_path_factory.mktemp("ckpt")
    save_pretrained(build("gpt2-tiny", seed=0), root / "single")
    save_pretrained(build("gpt2-tiny", seed=1), root / "sharded", max_shard_bytes=1 << 16)
    return root


@pytest.fixture
def copies(saved, tmp_path):
    for name in ("single", "sharded"):
        shutil.copytree(saved / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_link_out_of_the_folder_is_refused(copies, name):
    folder, elsewhere = copies / "single", copies / f"elsewhere-{name}"
    shutil.move(folder / name, elsewhere)
    os.symlink(elsewhere, folder / name)
    with pytest.raises(CheckpointError, match=f"{name} is a link to .*outside the checkpoint folder"):
        from_pretrained(folder)


def test_a_link_inside_the_folder_is_read(copies):
    folder = copies / "single"
    (folder / "real").mkdir()
    shutil.move(folder / "model.safetensors", folder / "real" / "model.safetensors")
    os.symlink("real/model.safetensors", folder / "model.safetensors")
    assert from_pretrained(folder) is not None


def test_a_stale_single_file_beside_an_index_is_refused(copies):
    sharded = copies / "sharded"
    assert (sharded / "model.safetensors.index.json").is_file()
    shutil.copyfile(copies / "single" / "model.safetensors", sharded / "model.safetensors")
    with pytest.raises(CheckpointError, match="holds both model.safetensors and model.safetensors.index.json"):
        from_pretrained(sharded)
    (sharded / "model.safetensors").unlink()  # without the stale file: the shards' weights (seed 1)
    loaded = from_pretrained(sharded)
    want = build("gpt2-tiny", seed=1).state_dict()
    assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items())
