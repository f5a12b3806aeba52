"""Reading a checkpoint folder: config.json, the shard index, safetensors headers and tensors.

A folder holds `model.safetensors`, or shards named by `model.safetensors.index.json`
(`model-00001-of-00020.safetensors` in Kimi Linear, `model-00001-of-000096.safetensors`,
a 6-digit total, in K3), never both (which one another tool loads differs, so k3c refuses to
guess). Every file read must lie inside the folder: a name of the index that leaves it and a
link to a file outside it (config.json, model.safetensors, the index, a shard) are refused. Headers are
read first (names, shapes, dtypes: nothing is loaded); tensors are then read one shard at a
time. A file that is not valid JSON or safetensors is a `CheckpointError` naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import CheckpointError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5,6}\.safetensors$")

# safetensors dtype names -> torch dtypes (those torch has; the rest are refused by name).
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a header describes it."""

    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: str  # the safetensors name: "BF16", "F32", "U8", ...

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * (torch.empty((), dtype=DTYPES[self.dtype]).element_size() if self.dtype in DTYPES else 1)


def read_json(file: Path) -> object:
    """The JSON in `file`; a CheckpointError naming the file when it is not JSON."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:  # RecursionError: nested too deep
        raise CheckpointError(f"{file.name}: not valid JSON ({err})") from None


def inside(folder: Path, name: object, what: str) -> Path:
    """`folder / name`, refused unless it is a relative path that stays inside `folder`."""
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{what}: {name!r} is not a file name")
    target = (folder / name).resolve()
    if Path(name).is_absolute() or not target.is_relative_to(folder.resolve()):
        raise CheckpointError(f"{what} names {name!r}, which is outside the checkpoint folder")
    return folder / name


def own_file(folder: Path, name: str) -> Path:
    """`folder / name`, refused when it is a link that leads outside `folder`."""
    file = folder / name
    if file.is_symlink() and not file.resolve().is_relative_to(folder.resolve()):
        raise CheckpointError(f"{name} is a link to {file.resolve()}, outside the checkpoint folder {folder}")
    return file


def weight_files(path: Path) -> tuple[list[Path], dict | None]:
    """The safetensors files of the folder and the index (None for a single file)."""
    single, index = own_file(path, WEIGHTS_NAME), own_file(path, INDEX_NAME)
    if single.is_file() and index.is_file():
        raise CheckpointError(f"{path} holds both {WEIGHTS_NAME} and {INDEX_NAME} with its shards; which is the "
                              f"checkpoint is ambiguous: remove the stale one")
    if single.is_file():
        return [single], None
    if not index.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {path}")
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{INDEX_NAME}: no 'weight_map' object")
    files = {}
    for key, name in weight_map.items():
        files.setdefault(name, inside(path, name, f"{INDEX_NAME} entry {key!r}"))
    for f in files.values():
        if not f.is_file():
            raise FileNotFoundError(f"{INDEX_NAME} names a shard that does not exist: {f.name}")
    return sorted(files.values()), data


def read_headers(files: list[Path]) -> tuple[dict[str, TensorInfo], dict[str, dict]]:
    """Tensor name -> TensorInfo over all files, and each file's `__metadata__`."""
    where: dict[str, TensorInfo] = {}
    metadata: dict[str, dict] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as fh:
                metadata[f.name] = dict(fh.metadata() or {})
                for k in fh.keys():
                    sl = fh.get_slice(k)
                    if k in where:
                        raise CheckpointError(f"tensor {k} is stored twice: in {where[k].file.name} and {f.name}")
                    where[k] = TensorInfo(f, k, tuple(sl.get_shape()), sl.get_dtype())
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{f.name}: not a readable safetensors file ({err})") from None
    return where, metadata


def check_index(where: dict[str, TensorInfo], index: dict | None, path: Path) -> None:
    """Every tensor the index lists is in the shard it names."""
    if index is None:
        return
    stray = [k for k, name in index["weight_map"].items() if k not in where or where[k].file != path / name]
    if stray:
        more = f", ... and {len(stray) - 12} more" if len(stray) > 12 else ""
        raise CheckpointError(f"{INDEX_NAME} lists tensor(s) not in the named shard: {', '.join(stray[:12])}{more}")


def read_shard(file: Path, keys: list[str], device: str | torch.device = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors `keys` of one file, one at a time (the file is mapped, not read whole)."""
    try:
        with safe_open(file, framework="pt", device=str(device)) as fh:
            for k in keys:
                yield k, fh.get_tensor(k)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{file.name}: cannot read its tensors ({err})") from None


__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "INDEX_NAME", "SHARD_RE", "DTYPES", "TensorInfo", "read_json",
           "inside", "own_file", "weight_files", "read_headers", "check_index", "read_shard"]
