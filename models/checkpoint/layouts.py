"""Weight layouts: which checkpoint tensor fills which region of which module tensor.

A plan is a list of `Entry`s, one per checkpoint tensor; each entry is one or more `Piece`s,
a region of the checkpoint tensor and the region of a module tensor it fills. The loader
copies `ckpt[piece.ckpt_index]` into `model[piece.model_key][piece.model_index]` one tensor
at a time, and `save_pretrained` reads the same regions back, so one table serves both ways.

Kimi models (Kimi Linear, K3) have two layouts (K3-SPEC.md section 8):
  official  the releases: per-expert `experts.E.{w1,w2,w3}.weight` (or, for MXFP4 experts,
            `.weight_packed` and `.weight_scale`), separate q/k/v depthwise convs `[C, 1, W]`,
            `A_log` as `[H]`, `(1, 1, H, 1)` (Kimi Linear) or `[head_dim]` zero-padded (K3).
            K3's names sit under `language_model.` beside `vision_tower.*` / `mm_projector.*`.
  hf        HF transformers' `kimi_linear`: packed q|k|v `conv1d`, `forget_gate.{f_a_proj,
            f_b_proj,dt_bias,A_log}`, `mlp.` instead of `block_sparse_moe.`, packed experts
            `experts.gate_up_proj [E, 2I, d]` (gate rows first) and `experts.down_proj`.
GPT-2 and the linear-attention ancestors use the `k3c` layout: the state dict as it is.
"""

from __future__ import annotations

import gc
import re
from contextlib import contextmanager
from typing import NamedTuple

import torch

from ..configs import KimiConfig
from .errors import CheckpointError

# The K3 release's language model sits under this prefix; these parts beside it are skipped.
TEXT_PREFIX = "language_model."
SKIPPED_PARTS = ("vision_tower.", "mm_projector.")


# Named tuples, not dataclasses: K3 has about 500,000 checkpoint tensors (896 experts x 3
# projections x 2 parts x 92 layers) and a plan makes one Entry each.
class Piece(NamedTuple):
    """`ckpt[ckpt_index]` (reshaped) is `model[model_key][model_index]`."""

    model_key: str
    model_index: tuple = ()
    ckpt_index: tuple = ()


class Entry(NamedTuple):
    """One checkpoint tensor: its name, its shape on disk and the module regions it fills."""

    key: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    packed: bool = False  # MXFP4 codes or scales: uint8 on disk and in the module
    zero_tail: tuple | None = None  # a region that must hold zeros (A_log padding)


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """State-dict names that alias an earlier name's tensor (GPT-2's lm_head): alias -> name."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            out[name] = seen[id(t)]
        else:
            seen[id(t)] = name
    return out


def _experts(name: str, t: torch.Tensor, ckpt_prefix: str) -> list[Entry]:
    """Packed module experts <-> one checkpoint tensor per expert and projection."""
    prefix, leaf = name.rsplit(".", 1)
    prefix = ckpt_prefix + prefix
    kind, _, part = leaf.partition("_")  # "w13" / "w2", then "" | "packed" | "scale"
    suffix = {"": "weight", "packed": "weight_packed", "scale": "weight_scale"}[part]
    E, rows, cols = t.shape
    out = []
    for e in range(E):
        if kind == "w13":
            I = rows // 2
            out.append(Entry(f"{prefix}.{e}.w1.{suffix}", (I, cols), (Piece(name, (e, slice(0, I))),), bool(part)))
            out.append(Entry(f"{prefix}.{e}.w3.{suffix}", (I, cols), (Piece(name, (e, slice(I, rows))),), bool(part)))
        else:
            out.append(Entry(f"{prefix}.{e}.w2.{suffix}", (rows, cols), (Piece(name, (e,)),), bool(part)))
    return out


def a_log_forms(H: int) -> str:
    return f"[{H}], [1, 1, {H}, 1] or [P > {H}] with a zero tail"


def _a_log(name: str, key: str, H: int, shape: tuple[int, ...]) -> Entry:
    """A_log [H] in the module; on disk [H], (1, 1, H, 1) or [P > H] zero-padded (K3)."""
    if len(shape) == 1 and shape[0] > H:
        return Entry(key, shape, (Piece(name, (), (slice(0, H),)),), zero_tail=(slice(H, None),))
    return Entry(key, shape, (Piece(name),))


def a_log_shape_ok(shape: tuple[int, ...], H: int) -> bool:
    return shape in ((H,), (1, 1, H, 1)) or (len(shape) == 1 and shape[0] > H)


def default_a_log_shape(cfg: KimiConfig, layout: str, k3_release: bool) -> tuple[int, ...]:
    """How a layout stores A_log: K3 pads it to head_dim, HF and Kimi Linear use (1, 1, H, 1)."""
    H = cfg.kda_heads
    if layout == "hf" or not k3_release:
        return (1, 1, H, 1)
    return (max(H, cfg.kda_head_dim),)


_FORGET_GATE = ("f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log")


def _hf_name(key: str) -> str:
    key = key.replace(".block_sparse_moe.", ".mlp.")
    key = re.sub(r"\.experts\.w13$", ".experts.gate_up_proj", key)
    key = re.sub(r"\.experts\.w2$", ".experts.down_proj", key)
    for leaf in _FORGET_GATE:
        if key.endswith(".self_attn." + leaf):
            key = key[: -len(leaf)] + "forget_gate." + leaf
    return key


def _packed_conv(prefix: str, sd: dict[str, torch.Tensor], key: str) -> Entry:
    """q_conv1d, k_conv1d, v_conv1d [C, 1, W] <-> HF's conv1d [3C, 1, W] (q, k, v in order)."""
    pieces, start = [], 0
    for x in "qkv":
        name = f"{prefix}{x}_conv1d.weight"
        C = sd[name].shape[0]
        pieces.append(Piece(name, (), (slice(start, start + C),)))
        start += C
    _, one, W = sd[f"{prefix}q_conv1d.weight"].shape
    return Entry(key, (start, one, W), tuple(pieces))


@contextmanager
def _no_gc():
    """Half a million small tuples trigger the cyclic collector over and over (3x the time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def plan(model: torch.nn.Module, layout: str, *, prefix: str = "",
         a_log_shapes: dict[str, tuple[int, ...]] | None = None, k3_release: bool = False) -> list[Entry]:
    """The entries between `model`'s state dict (meta tensors will do) and a checkpoint.

    layout "official", "hf" or "k3c"; `prefix` goes before every checkpoint name; `a_log_shapes`
    (checkpoint name -> shape) keeps the A_log form a checkpoint was read in, otherwise the
    layout's default form is used (`k3_release`: K3's zero-padded `[head_dim]`).
    """
    sd = model.state_dict()
    tied = tied_aliases(model)
    kimi = isinstance(model.config, KimiConfig)
    if layout not in ("official", "hf", "k3c") or (layout != "k3c" and not kimi):
        raise ValueError(f"no {layout!r} layout for {type(model).__name__}")
    with _no_gc():
        return _plan(model, sd, tied, layout, prefix, a_log_shapes or {}, k3_release)


def _plan(model: torch.nn.Module, sd: dict[str, torch.Tensor], tied: dict[str, str], layout: str, prefix: str,
          a_log_shapes: dict[str, tuple[int, ...]], k3_release: bool) -> list[Entry]:
    entries: list[Entry] = []
    for name, t in sd.items():
        if name in tied or (layout == "hf" and re.search(r"\.self_attn\.[kv]_conv1d\.weight$", name)):
            continue
        if layout == "k3c":
            entries.append(Entry(prefix + name, tuple(t.shape), (Piece(name),)))
        elif re.search(r"\.experts\.w(13|2)(_packed|_scale)?$", name) and layout == "official":
            entries.extend(_experts(name, t, prefix))
        elif name.endswith(("_packed", "_scale")) and layout == "hf":
            raise CheckpointError("MXFP4 routed experts have no HF transformers layout; use the release layout")
        elif name.endswith(".self_attn.q_conv1d.weight") and layout == "hf":
            p = name[: -len("q_conv1d.weight")]
            entries.append(_packed_conv(p, sd, prefix + _hf_name(p + "conv1d.weight")))
        elif name.endswith(".self_attn.A_log"):
            key = prefix + (_hf_name(name) if layout == "hf" else name)
            shape = a_log_shapes.get(key) or default_a_log_shape(model.config, layout, k3_release)
            entries.append(_a_log(name, key, t.shape[0], tuple(shape)))
        else:
            entries.append(Entry(prefix + (_hf_name(name) if layout == "hf" else name), tuple(t.shape),
                                 (Piece(name),)))
    return entries


_HF_MARKERS = re.compile(r"\.self_attn\.conv1d\.weight$|\.forget_gate\.|\.experts\.(gate_up_proj|down_proj)$")
_OFFICIAL_MARKERS = re.compile(
    r"\.experts\.\d+\.w[123]\.weight(_packed|_scale)?$|\.self_attn\.[qkv]_conv1d\.weight$|\.block_sparse_moe\.")


def detect_layout(keys: list[str], config: object) -> str:
    """"official" or "hf" for Kimi checkpoints (from the tensor names), "k3c" for the others."""
    if not isinstance(config, KimiConfig):
        return "k3c"
    hf = [k for k in keys if _HF_MARKERS.search(k)]
    official = [k for k in keys if _OFFICIAL_MARKERS.search(k)]
    if hf and official:
        raise CheckpointError(f"checkpoint mixes the HF layout ({hf[0]}) and the official layout ({official[0]})")
    return "hf" if hf else "official"


def detect_prefix(keys: list[str]) -> str:
    """`language_model.` when the text model sits under it (the K3 release), else ""."""
    return TEXT_PREFIX if any(k.startswith(TEXT_PREFIX) for k in keys) else ""


def is_skipped(key: str, prefix: str) -> bool:
    """The parts beside the language model in a multimodal checkpoint (skipped and reported)."""
    return bool(prefix) and key.startswith(SKIPPED_PARTS)


_MXFP4_EXPERT = re.compile(r"^(.*\.block_sparse_moe)\.experts\.\d+\.w[123]\.weight_(packed|scale)$")


def mxfp4_blocks(keys: list[str], prefix: str) -> set[str]:
    """Module names of the MoE blocks whose routed experts the checkpoint stores as MXFP4
    (detected by `weight_packed` / `weight_scale`, not by the config's `ignore` regexes)."""
    out = set()
    for k in keys:
        m = _MXFP4_EXPERT.match(k)
        if m and m.group(1).startswith(prefix):
            out.add(m.group(1)[len(prefix):])
    return out


# transformers saves kimi_linear by renaming every `.mlp.` back to `.block_sparse_moe.`, the
# dense layers' MLP included: read those as the `mlp` they are.
_DENSE_AS_MOE = re.compile(r"^(.*\.layers\.\d+\.)block_sparse_moe\.((?:gate|up|down)_proj\.weight)$")


def canonical_name(key: str) -> str:
    """A checkpoint name under the name the layouts use (see `_DENSE_AS_MOE`)."""
    return _DENSE_AS_MOE.sub(r"\1mlp.\2", key)


__all__ = ["Piece", "Entry", "plan", "detect_layout", "detect_prefix", "is_skipped", "mxfp4_blocks",
           "canonical_name", "tied_aliases", "a_log_shape_ok", "a_log_forms", "TEXT_PREFIX", "SKIPPED_PARTS"]
