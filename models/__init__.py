"""k3c.models: the eager reference zoo, GPT-2 to Kimi K3.

    model = k3c.models.build("k3-tiny", seed=0)        # deterministic weights
    logits = model(input_ids)                          # [B, T] -> [B, T, vocab]
    logits, state = model.prefill(input_ids)
    logits, state = model.decode(next_ids, state)      # next_ids [B, 1]
"""

from __future__ import annotations

if __name__ != "k3c.models":  # this folder imported under its bare name, e.g. by a script in the repository root
    raise ImportError(f"'{__name__}' is a folder of k3c's source tree, not a package: import k3c.models. A script "
                      f"run from k3c's repository root finds this folder when it, or a library it uses (transformers "
                      f"looks for a package named 'kernels'), imports 'models': run it from another directory")


import torch

from .common import CausalLM, init_weights
from .configs import FULL_SIZE, PRESETS, GPT2Config, KimiConfig, LinearConfig, config_for
from .gpt2 import GPT2
from .kimi import KimiModel
from .linear_lm import LinearLM

NAMES = tuple(PRESETS)


def from_config(cfg: object) -> CausalLM:
    """The module of a config, with uninitialised weights."""
    if isinstance(cfg, GPT2Config):
        return GPT2(cfg)
    if isinstance(cfg, LinearConfig):
        return LinearLM(cfg)
    if isinstance(cfg, KimiConfig):
        return KimiModel(cfg)
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def build(name: str, seed: int = 0, *, device: str | torch.device | None = None,
          dtype: torch.dtype = torch.float32, **overrides) -> CausalLM:
    """Model `name` of the zoo with deterministic weights from `seed`.

    Full-size models (`gpt2`, `kimi-linear`, `k3`) are built on the meta device unless a
    device is given; `overrides` replace config fields (e.g. `num_layers=4`).
    """
    cfg = config_for(name, **overrides)
    if device is None:
        device = "meta" if name in FULL_SIZE else "cpu"
    with torch.device(device):
        model = from_config(cfg)
    if torch.device(device).type != "meta":
        init_weights(model, seed)
    model.name = name
    return model.to(dtype).eval()


def from_pretrained(path: str, **kwargs) -> CausalLM:
    """A model from a directory with config.json and *.safetensors (official K3 or HF layout)."""
    from .checkpoint import from_pretrained as _load

    return _load(path, **kwargs)


def save_pretrained(model: CausalLM, path: str, **kwargs) -> None:
    """Write config.json and model.safetensors in the official layout."""
    from .checkpoint import save_pretrained as _save

    _save(model, path, **kwargs)


__all__ = ["build", "from_pretrained", "save_pretrained", "from_config", "config_for", "NAMES",
           "CausalLM", "GPT2Config", "LinearConfig", "KimiConfig"]
