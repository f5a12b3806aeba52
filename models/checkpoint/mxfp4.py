"""MXFP4 routed experts on disk: the `quantization_config` that says so, read and written.

The K3 release stores its routed experts as compressed-tensors `mxfp4-pack-quantized`
(weight-only, E2M1 codes, group 32, `scale_dtype uint8`, i.e. E8M0), the config inside
`text_config`. Which tensors are quantized is read from the names (`weight_packed` and
`weight_scale`, see `layouts.mxfp4_blocks`), not from the config's `ignore` regexes, which
do not name every BF16 tensor. The config is checked so that another 4-bit format (a
different group size, integer codes) is refused rather than decoded as MXFP4. The codec is
`k3c.kernels.mxfp4`.
"""

from __future__ import annotations

from ...kernels.mxfp4 import GROUP_SIZE
from .errors import CheckpointError

FORMAT = "mxfp4-pack-quantized"

# What k3c writes for a model with MXFP4 experts (the release's fields).
WEIGHTS = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": GROUP_SIZE,
           "dynamic": False, "scale_dtype": "torch.uint8"}
IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
          "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]


def quantization_config() -> dict:
    """The `quantization_config` of a model whose routed experts are MXFP4."""
    return {"quant_method": "compressed-tensors", "format": FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": {"format": FORMAT, "targets": ["Linear"], "weights": dict(WEIGHTS),
                                          "input_activations": None, "output_activations": None}},
            "ignore": list(IGNORE)}


def check_quantization(text_config: dict, has_packed: bool) -> None:
    """Refuse a quantization_config that packed tensors cannot be read under as MXFP4."""
    q = text_config.get("quantization_config")
    if q is None:
        return  # the tensors' names, dtypes and shapes (U8, K/2 and K/32) say MXFP4 already
    if not isinstance(q, dict):
        raise CheckpointError(f"config.json: quantization_config is {type(q).__name__}, not an object")
    if not has_packed:
        return  # nothing packed to decode: a BF16 conversion that kept the field
    method = q.get("quant_method", "compressed-tensors")
    groups = q.get("config_groups") or {}
    formats = {q.get("format")} | {g.get("format") for g in groups.values() if isinstance(g, dict)}
    formats.discard(None)
    if method != "compressed-tensors" or formats - {FORMAT}:
        raise CheckpointError(f"config.json: quantization_config {method}/{sorted(formats)} is not "
                              f"compressed-tensors {FORMAT!r}, the only packed format k3c reads")
    for name, g in groups.items():
        w = (g or {}).get("weights") or {}
        bad = {k: w.get(k) for k, v in (("num_bits", 4), ("type", "float"), ("group_size", GROUP_SIZE))
               if k in w and w.get(k) != v}
        if bad:
            raise CheckpointError(f"config.json: quantization_config.config_groups.{name}.weights {bad} is not "
                                  f"MXFP4 (4-bit float codes in groups of {GROUP_SIZE})")


__all__ = ["FORMAT", "quantization_config", "check_quantization"]
