"""A transformers model in memory -> the k3c model it is, its weights mapped, never saved.

    model = from_hf_model(hf_model)     # a transformers KimiLinearForCausalLM, say

The config is read by the same reader as a checkpoint's config.json (`config_from_json`) and
the weights placed by the same layout plans as `from_pretrained` (models/checkpoint), from
the module's state dict instead of safetensors files: a module tensor that one checkpoint
tensor fills whole is a view of it (no copy; the transformers model keeps owning the
memory), one assembled from several is copied. A k3c model is taken as it is.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError, UsageError
from ..models.checkpoint.layouts import canonical_name, detect_layout, detect_prefix, is_skipped, plan, tied_aliases
from ..models.checkpoint.loading import check
from ..models.checkpoint.shards import DTYPES, TensorInfo
from ..models.configs import KimiConfig

_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}


def is_k3c_model(model: object) -> bool:
    """A model of k3c's zoo (or one k3c loaded): prefill/decode over a dataclass config."""
    return all(hasattr(model, a) for a in ("prefill", "decode", "extend")) and not hasattr(model, "generate")


def _state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # remove_duplicate=False would list a tied lm_head twice; the loader re-ties k3c's own ties
    return {k: v.detach() for k, v in model.state_dict().items()}


def from_hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The k3c model of `model` (a transformers PreTrainedModel whose config and weights k3c's
    loader reads: Kimi Linear, or a model saved by k3c), sharing its weights where it can.
    A model k3c cannot read is a CheckpointError naming the config field or the tensors."""
    from ..models import from_config
    from ..models.checkpoint import config_from_json

    if is_k3c_model(model):
        return model
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise UsageError(f"{type(model).__name__} is neither a k3c model nor a transformers model with a config")
    try:
        cfg = config_from_json(config.to_dict())
    except CheckpointError as err:  # the reader speaks of config.json; here it is the model's config
        raise CheckpointError(f"{type(model).__name__}: its config is no model k3c reads: {err}") from None
    sd = {canonical_name(k): v for k, v in _state_dict(model).items()}
    prefix = detect_prefix(list(sd)) if isinstance(cfg, KimiConfig) else ""
    sd = {k: v for k, v in sd.items() if not is_skipped(k, prefix)}
    with torch.device("meta"):
        ours = from_config(cfg)
    layout = detect_layout([k.removeprefix(prefix) for k in sd], cfg)
    a_log = {k: tuple(v.shape) for k, v in sd.items() if k.endswith(".A_log")}
    entries = plan(ours, layout, prefix=prefix, a_log_shapes=a_log)
    found = {k: TensorInfo(Path("<memory>"), k, tuple(v.shape), _NAME_OF.get(v.dtype, str(v.dtype)))
             for k, v in sd.items()}
    check(entries, found, layout)
    target = ours.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for e in entries:
        src = sd[e.key]
        for p in e.pieces:
            piece = src[p.ckpt_index]
            if p.model_index == ():  # the piece is the whole module tensor: a view, no copy
                tensors[p.model_key] = piece.reshape(target[p.model_key].shape)
                continue
            if p.model_key not in tensors:
                tensors[p.model_key] = torch.empty(target[p.model_key].shape, dtype=src.dtype, device=src.device)
            region = tensors[p.model_key][p.model_index]
            region.copy_(piece.reshape(region.shape))
    tied = tied_aliases(ours)
    for alias, name in tied.items():
        tensors[alias] = tensors[name]
    ours.load_state_dict(tensors, strict=True, assign=True)
    for alias, name in tied.items():  # assign=True gave the alias a tensor of its own: tie it again
        owner, _, leaf = alias.rpartition(".")
        src_owner, _, src_leaf = name.rpartition(".")
        setattr(ours.get_submodule(owner), leaf, getattr(ours.get_submodule(src_owner), src_leaf))
    ours.name = _name_of(config)
    return ours.eval()


def _name_of(config) -> str:
    """A name for the artifacts' manifests: the checkpoint's folder name, else the model type."""
    path = str(getattr(config, "_name_or_path", "") or "")
    return Path(path).name or str(getattr(config, "model_type", "transformers-model"))


__all__ = ["from_hf_model", "is_k3c_model"]
