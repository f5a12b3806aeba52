"""Checkpoints on disk: `config.json` beside safetensors weights (K3-SPEC.md section 8).

    model = from_pretrained("dir")          # the K3 release, the Kimi Linear release, HF, k3c's own
    save_pretrained(model, "dir")           # the release layout of the model's family

Files, each owning one part:
  config_json  config.json <-> dataclass configs, the K3 release's `kimi_k3` wrapper
  layouts      which checkpoint tensor fills which region of which module tensor
  mxfp4        the `quantization_config` of MXFP4 routed experts
  shards       the folder: index, path checks, safetensors headers, one shard at a time
  loading      from_pretrained (meta model, checks, shard-by-shard fill)
  writing      save_pretrained
"""

from __future__ import annotations

from .config_json import (
    KDA_KEYS,
    KIMI_KEYS,
    config_from_json,
    config_to_json,
    kimi_config_from_json,
    kimi_config_to_json,
    release_config_json,
)
from .errors import CheckpointError
from .layouts import detect_layout, plan
from .loading import CheckpointInfo, from_pretrained
from .writing import save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "CheckpointError", "CheckpointInfo", "config_to_json",
           "config_from_json", "kimi_config_to_json", "kimi_config_from_json", "release_config_json", "plan",
           "detect_layout", "KIMI_KEYS", "KDA_KEYS"]
