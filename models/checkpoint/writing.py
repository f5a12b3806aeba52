"""`save_pretrained`: a model into a checkpoint folder in its family's release layout.

    save_pretrained(model, "dir")                      # one model.safetensors
    save_pretrained(model, "dir", max_shard_bytes=n)   # shards + model.safetensors.index.json

K3 models are written as the K3 release (the `kimi_k3` wrapper config, names under
`language_model.`, `A_log` zero-padded to `[head_dim]`, MXFP4 experts as `weight_packed` /
`weight_scale`, shards `model-00001-of-000003.safetensors` with a 6-digit total); Kimi
Linear as its release (flat config, `A_log (1, 1, H, 1)`, `-of-00020` names); the others
in k3c's names. Tensors keep the model's dtypes. A model read by `from_pretrained` is
written back as it was read: the same names, dtypes and bytes, the same file for each
tensor, the same A_log form and file metadata (its vision parts, skipped at load, are not
written). One shard's tensors exist at a time.

Writing is all or nothing: the files go to a temporary folder beside `dir` first, and only
when every one is written are they swapped in (the old weights and config moved aside, the
new ones moved in, the old ones deleted; on a failure the old ones are put back). A model
saved into the folder it was read from, on a full disk or under a file-size limit, leaves
that folder as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..common import CausalLM
from ..configs import KimiConfig, kimi_model_type
from ..moe_layer import MXFP4Experts
from ..precision import bytes_by_dtype, unique_tensors
from .config_json import config_to_json, merge_config, release_config_json, text_config
from .errors import CheckpointError
from .layouts import TEXT_PREFIX, Entry, plan
from .mxfp4 import quantization_config
from .shards import CONFIG_NAME, INDEX_NAME, SHARD_RE, WEIGHTS_NAME


def _tensor(entry: Entry, sd: dict[str, torch.Tensor]) -> torch.Tensor:
    """The checkpoint tensor of `entry`, gathered from the module's regions."""
    first = sd[entry.pieces[0].model_key]
    out = torch.zeros(entry.shape, dtype=first.dtype)
    for p in entry.pieces:
        region = out[p.ckpt_index]
        region.copy_(sd[p.model_key][p.model_index].detach().to("cpu").reshape(region.shape))
    return out


def _nbytes(entry: Entry, sd: dict[str, torch.Tensor]) -> int:
    n = 1
    for s in entry.shape:
        n *= s
    return n * sd[entry.pieces[0].model_key].element_size()


def _shard_names(entries: list[Entry], sd: dict[str, torch.Tensor], max_shard_bytes: int | None,
                 kept: dict[str, str] | None, six_digits: bool) -> dict[str, str]:
    """Checkpoint name -> file name: as read, by size, or one file."""
    if kept is not None and max_shard_bytes is None and all(e.key in kept for e in entries):
        return {e.key: kept[e.key] for e in entries}
    if max_shard_bytes is None:
        return {e.key: WEIGHTS_NAME for e in entries}
    groups: list[list[str]] = [[]]
    size = 0
    for e in entries:
        n = _nbytes(e, sd)
        if groups[-1] and size + n > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(e.key)
        size += n
    total = f"{len(groups):06d}" if six_digits else f"{len(groups):05d}"
    return {k: f"model-{i + 1:05d}-of-{total}.safetensors" for i, g in enumerate(groups) for k in g}


def _config(model: CausalLM, k3_release: bool, info: object | None) -> dict:
    cfg = model.config
    base = info.config if info is not None and info.layout == "official" else None
    if k3_release:
        floating = {k: t for k, t in unique_tensors(model).items() if t.is_floating_point()}
        dtype = next(iter(bytes_by_dtype(floating)), "float32")
        quantization = None
        if any(isinstance(m, MXFP4Experts) for m in model.modules()):  # the one read, else k3c's
            quantization = text_config(base or {}).get("quantization_config") or quantization_config()
        return release_config_json(cfg, dtype=dtype, quantization=quantization, base=base)
    return merge_config(base or {}, config_to_json(cfg))


def save_pretrained(model: CausalLM, path: str | Path, *, max_shard_bytes: int | None = None) -> None:
    """Write config.json and the weights (see the module docstring for the layouts).

    With `max_shard_bytes`, tensors are split in state-dict order over shards with a
    `model.safetensors.index.json`; without it, a model read from a sharded checkpoint keeps
    that checkpoint's split, any other model is one `model.safetensors`.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    kimi = isinstance(cfg, KimiConfig)
    k3_release = kimi and kimi_model_type(cfg) == "kimi_k3"
    info = getattr(model, "checkpoint_info", None)
    prefix = TEXT_PREFIX if k3_release else ""
    same_names = info is not None and info.prefix == prefix and info.layout == ("official" if kimi else "k3c")
    entries = plan(model, "official" if kimi else "k3c", prefix=prefix, k3_release=k3_release,
                   a_log_shapes=info.a_log_shapes if same_names else None)
    sd = model.state_dict()
    files = _shard_names(entries, sd, max_shard_bytes, info.shard_of if same_names else None, k3_release)

    work = Path(tempfile.mkdtemp(prefix=f".{path.resolve().name}.saving-", dir=path.resolve().parent))
    try:
        _write(work, model, entries, sd, files, k3_release, info, same_names)
        _swap_in(work, path)
    except OSError as err:
        raise CheckpointError(f"cannot write the checkpoint into {path} ({err.strerror or err}); "
                              "the folder is as it was") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write(folder: Path, model: CausalLM, entries: list[Entry], sd: dict[str, torch.Tensor],
           files: dict[str, str], k3_release: bool, info: object | None, same_names: bool) -> None:
    (folder / CONFIG_NAME).write_text(json.dumps(_config(model, k3_release, info), indent=2) + "\n")
    by_file: dict[str, list[Entry]] = {}
    for e in entries:
        by_file.setdefault(files[e.key], []).append(e)
    for name, group in by_file.items():
        meta = (info.metadata.get(name) if same_names else None) or {"format": "pt"}
        try:
            save_file({e.key: _tensor(e, sd) for e in group}, str(folder / name), metadata=meta)
        except Exception as err:  # safetensors reports a failed write as its own error type
            if isinstance(err, OSError):
                raise
            raise OSError(0, f"{name}: {err}") from None
    if list(by_file) == [WEIGHTS_NAME]:
        return
    index_meta = dict((info.index_metadata or {}) if same_names else {})
    index_meta["total_size"] = sum(_nbytes(e, sd) for e in entries)
    index = {"metadata": index_meta, "weight_map": {k: files[k] for k in sorted(files)}}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def _ours(name: str) -> bool:
    """A file save_pretrained writes or replaces: config, weights, index (stale ones included)."""
    return name in (CONFIG_NAME, WEIGHTS_NAME, INDEX_NAME) or bool(SHARD_RE.match(name))


def _swap_in(new: Path, path: Path) -> None:
    """Replace `path`'s config and weights by those of `new` (same file system); other files stay."""
    aside = Path(tempfile.mkdtemp(prefix=f".{path.resolve().name}.old-", dir=path.resolve().parent))
    moved: list[str] = []
    placed: list[str] = []
    try:
        for old in sorted(p.name for p in path.iterdir() if _ours(p.name)):
            os.replace(path / old, aside / old)
            moved.append(old)
        for name in sorted(p.name for p in new.iterdir()):
            os.replace(new / name, path / name)
            placed.append(name)
    except OSError:
        for name in placed:
            os.replace(path / name, new / name)
        for old in moved:
            os.replace(aside / old, path / old)
        aside.rmdir()  # empty again; were it not, the old files would still be there
        raise
    shutil.rmtree(aside, ignore_errors=True)


__all__ = ["save_pretrained"]
