"""k3c.models: the eager reference zoo, GPT-2 to Kimi K3.

    model = k3c.models.build("k3-tiny", seed=0)        # deterministic weights
    logits = model(input_ids)                          # [B, T] -> [B, T, vocab]
    logits, state = model.prefill(input_ids)
    logits, state = model.decode(next_ids, state)      # next_ids [B, 1]
"""

from __future__ import annotations

if __name__ != "k3c.models":  # imported under its bare name, e.g. from the repository root: kernels/bare_name.py
    import os as _os
    import runpy as _runpy  # by path: under a bare name there is no package to import the guard from

    _runpy.run_path(_os.path.join(_os.path.dirname(_os.path.dirname(__file__)), "kernels", "bare_name.py"))[
        "guard"](globals())  # a probe gets a stand-in that holds nothing; an import statement, the error


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


def build(name: str, seed: int = 0, dtype: torch.dtype | str | None = None, experts: str | None = None, *,
          device: str | torch.device | None = None, **overrides) -> CausalLM:
    """Model `name` of the zoo with deterministic weights from `seed`.

    Full-size models (`gpt2`, `kimi-linear`, `k3`) are built on the meta device unless a
    device is given; `overrides` replace config fields (e.g. `num_layers=4`).

    dtype    None: fp32 everywhere (the default build). A floating dtype: the storage policy
             of the family's release in that dtype, i.e. every floating weight in `dtype`
             except the tensors the release keeps in F32 (K3: KDA `A_log`, `dt_bias`, convs,
             `o_norm`, the router's correction bias; Kimi Linear: `A_log`, `dt_bias`).
    experts  None: dense routed experts. "mxfp4": routed experts as MXFP4 codes + E8M0
             scales, encoded from the fp32 weights of the seed (`kernels/mxfp4`).
    So `build("k3-small", dtype=torch.bfloat16, experts="mxfp4")` is k3-small as K3 is released.
    """
    from .precision import as_dtype, quantize_experts, to_release_dtypes

    dtype = as_dtype(dtype)
    if experts not in (None, "mxfp4"):
        raise ValueError(f"experts must be None (dense) or 'mxfp4', got {experts!r}")
    cfg = config_for(name, **overrides)
    if device is None:
        device = "meta" if name in FULL_SIZE else "cpu"
    with torch.device(device):
        model = from_config(cfg)
    if torch.device(device).type != "meta":
        init_weights(model, seed)
    model.name = name
    if experts == "mxfp4":
        quantize_experts(model)
    if dtype is None or dtype == torch.float32:
        return model.to(torch.float32).eval()
    return to_release_dtypes(model, dtype).eval()


def from_pretrained(path: str, dtype: torch.dtype | str | None = None, **kwargs) -> CausalLM:
    """A model from a directory with config.json and *.safetensors (the K3 release, the Kimi
    Linear release or the HF layout). `dtype` None keeps the stored dtypes (BF16, F32, MXFP4
    experts packed); a dtype casts every floating tensor to it (MXFP4 experts stay packed)."""
    from .checkpoint import from_pretrained as _load

    return _load(path, dtype=dtype, **kwargs)


def save_pretrained(model: CausalLM, path: str, **kwargs) -> None:
    """Write config.json and the safetensors weights in the release layout of the model's family."""
    from .checkpoint import save_pretrained as _save

    _save(model, path, **kwargs)


__all__ = ["build", "from_pretrained", "save_pretrained", "from_config", "config_for", "NAMES",
           "CausalLM", "GPT2Config", "LinearConfig", "KimiConfig"]
