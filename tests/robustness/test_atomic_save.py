"""save_pretrained into the folder a model was read from is all or nothing: under a file-size
limit (ulimit -f) the folder keeps every shard it had (once only config.json was left)."""

from __future__ import annotations

import subprocess
import sys

import torch

from k3c import models

SAVE_UNDER_LIMIT = """
import resource, sys
from k3c import models
from k3c.errors import CheckpointError
m = models.from_pretrained(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # the shards are larger than this
try:
    models.save_pretrained(m, sys.argv[1], max_shard_bytes=60000)
except CheckpointError as e:
    print("REFUSED", e)
"""


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_failed_save_into_the_models_own_folder_keeps_it(tmp_path):
    folder = tmp_path / "m"
    models.save_pretrained(models.build("gpt2-tiny"), folder, max_shard_bytes=200000)
    (folder / "README.md").write_text("kept\n")
    before = _files(folder)
    assert sum(n.startswith("model-") for n in before) > 1
    r = subprocess.run([sys.executable, "-c", SAVE_UNDER_LIMIT, str(folder)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "REFUSED cannot write the checkpoint into" in r.stdout and "the folder is as it was" in r.stdout
    assert _files(folder) == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary folder left beside it


def test_a_save_into_the_models_own_folder_replaces_its_weights(tmp_path):
    folder = tmp_path / "m"
    models.save_pretrained(models.build("gpt2-tiny"), folder, max_shard_bytes=200000)
    (folder / "README.md").write_text("kept\n")
    m = models.from_pretrained(folder)
    with torch.no_grad():
        next(m.parameters()).mul_(2)
    models.save_pretrained(m, folder, max_shard_bytes=10**9)  # one shard: the 13 old ones go
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["README.md", "config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    again = models.from_pretrained(folder)
    for (k, a), (_, b) in zip(m.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
