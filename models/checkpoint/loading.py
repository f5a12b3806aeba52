"""`from_pretrained`: a checkpoint folder into a model, one shard at a time.

    model = from_pretrained("dir")            # keeps the stored dtypes (BF16, F32, MXFP4)
    model = from_pretrained("dir", dtype=torch.float32)    # casts the floating tensors

The module is built on the meta device; the headers of every file are checked against it
first (all missing, unexpected, misshaped and unusable tensors in one `CheckpointError`),
then each module tensor is allocated once, in its final dtype, and every shard is read in
turn into its regions. Peak memory is the model plus one mapped shard: the checkpoint is
never held twice. What was read (layout, names per shard, A_log forms, skipped vision
tensors) is kept on `model.checkpoint_info`, so `save_pretrained` can write it back as it was.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..common import CausalLM
from ..configs import KimiConfig
from ..moe_layer import MXFP4Experts
from ..precision import as_dtype
from ..validate import check_weight_dtypes
from .config_json import check_memory, config_from_json, text_config
from .errors import CheckpointError
from .layouts import (
    Entry,
    a_log_forms,
    a_log_shape_ok,
    canonical_name,
    detect_layout,
    detect_prefix,
    is_skipped,
    mxfp4_blocks,
    plan,
    tied_aliases,
)
from .mxfp4 import check_quantization
from .shards import (
    CONFIG_NAME,
    DTYPES,
    TensorInfo,
    check_index,
    own_file,
    read_headers,
    read_json,
    read_shard,
    weight_files,
)

log = logging.getLogger("k3c.models")

# What a module tensor may be stored as: a floating dtype, or U8 for MXFP4 codes and scales.
FLOATING = ("F32", "BF16", "F16", "F64")


@dataclass
class CheckpointInfo:
    """What `from_pretrained` read, for reports and for writing the checkpoint back."""

    path: Path
    layout: str  # "official", "hf" or "k3c"
    prefix: str  # "language_model." for the K3 release
    config: dict  # config.json as read
    shard_of: dict[str, str]  # checkpoint name -> file name, for the tensors read
    metadata: dict[str, dict]  # file name -> its safetensors __metadata__
    index_metadata: dict | None  # the index's "metadata", None for a single file
    a_log_shapes: dict[str, tuple[int, ...]]  # checkpoint name -> the A_log form stored
    skipped: list[str] = field(default_factory=list)  # vision parts, not read
    skipped_bytes: int = 0
    bytes_read: int = 0


def _listing(items: list[str], limit: int = 12) -> str:
    more = f", ... and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check(entries: list[Entry], found: dict[str, TensorInfo], layout: str) -> None:
    """Raise one CheckpointError naming every missing, unexpected, misshaped or unusable tensor."""
    want = {e.key: e for e in entries}
    missing = [f"{k} {list(e.shape)}" for k, e in want.items() if k not in found]
    unexpected = [f"{k} {list(t.shape)}" for k, t in found.items() if k not in want]
    misshaped = [f"{k}: expected {list(e.shape)}, got {list(found[k].shape)}" for k, e in want.items()
                 if k in found and found[k].shape != e.shape]
    bad_dtype = []
    for k, e in want.items():
        if k in found and (found[k].dtype != "U8" if e.packed else found[k].dtype not in FLOATING):
            need = "U8 (MXFP4 codes and scales)" if e.packed else "a floating dtype (F32, BF16, F16, F64)"
            bad_dtype.append(f"{k} is {found[k].dtype}, needs {need}")
    problems = []
    for what, items in (("missing", missing), ("unexpected", unexpected), ("misshaped", misshaped),
                        ("of a dtype the model cannot use", bad_dtype)):
        if items:
            problems.append(f"{len(items)} {what} tensor(s): {_listing(items)}")
    if problems:
        raise CheckpointError(f"checkpoint ({layout} layout) does not fit the config: " + "; ".join(problems))


def _module_dtypes(entries: list[Entry], found: dict[str, TensorInfo], dtype: torch.dtype | None,
                   sd: dict[str, torch.Tensor]) -> dict[str, torch.dtype]:
    """The dtype each module tensor is held in: as stored (all its pieces must agree), or `dtype`."""
    stored: dict[str, set[str]] = defaultdict(set)
    for e in entries:
        for p in e.pieces:
            stored[p.model_key].add(found[e.key].dtype)
    out = {}
    for key in sd:
        kinds = stored.get(key)
        if not kinds:
            continue
        floating = all(DTYPES[k].is_floating_point for k in kinds)
        if dtype is not None and floating:
            out[key] = dtype  # a cast on purpose: whatever each piece was stored in
        elif len(kinds) > 1:
            raise CheckpointError(f"{key} is stored in mixed dtypes {sorted(kinds)}; its tensors must agree "
                                  "(or pass dtype= to cast them)")
        else:
            out[key] = DTYPES[kinds.pop()]
    return out


def _place(entry: Entry, src: torch.Tensor, tensors: dict[str, torch.Tensor], file: Path) -> None:
    if entry.zero_tail is not None:
        tail = src[entry.zero_tail].contiguous()
        if torch.count_nonzero(tail.view(torch.uint8)):
            raise CheckpointError(f"{file.name}: {entry.key} {list(src.shape)} holds non-zero values past "
                                  f"its first {src.shape[0] - tail.shape[0]} (the heads); the padding must be zero")
    for p in entry.pieces:
        dst = tensors[p.model_key][p.model_index]
        dst.copy_(src[p.ckpt_index].reshape(dst.shape))


def _retie(model: torch.nn.Module, tied: dict[str, str]) -> None:
    for alias, name in tied.items():
        owner, _, leaf = alias.rpartition(".")
        src_owner, _, src_leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, getattr(model.get_submodule(src_owner), src_leaf))


def _use_mxfp4_experts(model: torch.nn.Module, blocks: set[str]) -> None:
    """On the meta model: the MoE blocks the checkpoint stores as MXFP4 get MXFP4 experts."""
    for name in sorted(blocks):
        try:
            moe = model.get_submodule(name)
        except AttributeError:
            continue  # not a block of this config: reported as unexpected tensors
        E, two_i, D = moe.experts.w13.shape
        with torch.device("meta"):
            moe.experts = MXFP4Experts(E, D, two_i // 2)


def from_pretrained(path: str | Path, *, dtype: torch.dtype | str | None = None,
                    device: str | torch.device = "cpu") -> CausalLM:
    """The model in directory `path` (config.json + model.safetensors or an index with shards).

    `dtype` None keeps each tensor's stored dtype; otherwise floating tensors are cast
    (MXFP4 codes and scales stay packed). Raises CheckpointError (a ValueError) naming
    every file or tensor that does not fit the config.
    """
    from .. import from_config

    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path}")
    raw = read_json(own_file(path, CONFIG_NAME))
    cfg = config_from_json(raw)
    check_memory(cfg)  # a config.json of 10^9 layers is refused here, not by exhausting the memory
    files, index = weight_files(path)
    where, metadata = read_headers(files)
    check_index(where, index, path)
    prefix = detect_prefix(list(where)) if isinstance(cfg, KimiConfig) else ""
    skipped = sorted(k for k in where if is_skipped(k, prefix))
    found: dict[str, TensorInfo] = {}
    for k, info in where.items():
        name = canonical_name(k)
        if k in skipped:
            continue
        if name in found:
            raise CheckpointError(f"tensor {name} is stored twice (also as {found[name].key})")
        found[name] = info

    with torch.device("meta"):
        model = from_config(cfg)
    blocks = mxfp4_blocks(list(found), prefix)
    check_quantization(text_config(raw), bool(blocks))
    _use_mxfp4_experts(model, blocks)
    layout = detect_layout([k.removeprefix(prefix) for k in found], cfg)
    H = getattr(cfg, "kda_heads", 0)
    a_log = {k: t.shape for k, t in found.items() if k.endswith(".A_log") and a_log_shape_ok(t.shape, H)}
    entries = plan(model, layout, prefix=prefix, a_log_shapes=a_log)
    try:
        check(entries, found, layout)
    except CheckpointError as err:
        if any(k.endswith(".A_log") and k not in a_log for k in found):
            raise CheckpointError(f"{err}; A_log is stored as {a_log_forms(H)}") from None
        raise

    dtype = as_dtype(dtype)
    sd = model.state_dict()
    dtypes = _module_dtypes(entries, found, dtype, sd)
    check_weight_dtypes(cfg, dtypes)
    tensors = {k: torch.empty(sd[k].shape, dtype=dtypes[k], device=device) for k in dtypes}
    by_file: dict[Path, list[Entry]] = defaultdict(list)
    for e in entries:
        by_file[found[e.key].file].append(e)
    for file in sorted(by_file):
        todo = {found[e.key].key: e for e in by_file[file]}
        for key, src in read_shard(file, list(todo), device):
            _place(todo[key], src, tensors, file)
            del src  # one tensor of the shard at a time beside the model

    tied = tied_aliases(model)
    for alias, name in tied.items():
        tensors[alias] = tensors[name]
    model.load_state_dict(tensors, strict=True, assign=True)
    _retie(model, tied)
    model.name = path.name
    model.checkpoint_info = CheckpointInfo(
        path=path, layout=layout, prefix=prefix, config=raw if isinstance(raw, dict) else {},
        shard_of={k: found[k].file.name for k in (e.key for e in entries)}, metadata=metadata,
        index_metadata=(index.get("metadata") if index else None), a_log_shapes=dict(a_log),
        skipped=skipped, skipped_bytes=sum(where[k].nbytes for k in skipped),
        bytes_read=sum(found[e.key].nbytes for e in entries))
    if skipped:
        parts = sorted({k.split(".", 1)[0] for k in skipped})
        log.info("%s: skipped %d tensors beside the language model (%s), %d bytes", path.name, len(skipped),
                 ", ".join(f"{p}.*" for p in parts), model.checkpoint_info.skipped_bytes)
    return model.eval()


__all__ = ["from_pretrained", "CheckpointInfo", "check"]
