"""Writing an ONNX artifact: `DIR/{entry}.onnx`, one shared `DIR/weights.bin` of external
data, and `DIR/manifest.json` (inputs/outputs with names, dtypes and symbolic shapes, the
state names, flavour, pipeline, model name/config, k3c version).

    write_artifact(out_dir, {"prefill": model, "decode": model}, manifest)
    read_manifest(out_dir) -> dict

Weights read by both graphs are stored once; every tensor of 1 KiB or more is external.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnx.external_data_helper import set_external_data

from ...errors import ArtifactError
from ...ir import Graph
from ..contract import id_bounds
from .builder import NUMPY_TYPES, OPSET
from .lower import PRESENT

WEIGHTS = "weights.bin"
MANIFEST = "manifest.json"
FORMAT = "k3c-onnx"
EXTERNAL_MIN_BYTES = 1024

DTYPE_NAMES = {k: np.dtype(v).name for k, v in NUMPY_TYPES.items()} | {"bf16": "bfloat16"}


def _align(offset: int, size: int) -> int:
    a = 4096 if size >= 1 << 20 else 64
    return -(-offset // a) * a


def write_weights(models: dict[str, onnx.ModelProto], out_dir: Path) -> int:
    """Move every large initializer of `models` into one shared file; returns its size."""
    placed: dict[tuple[str, str], tuple[int, int]] = {}
    with open(out_dir / WEIGHTS, "wb") as f:
        for model in models.values():
            for t in model.graph.initializer:
                if len(t.raw_data) < EXTERNAL_MIN_BYTES:
                    continue
                key = (t.name, hashlib.sha1(t.raw_data).hexdigest())
                if key not in placed:
                    offset = _align(f.tell(), len(t.raw_data))
                    f.seek(offset)
                    f.write(t.raw_data)
                    placed[key] = (offset, len(t.raw_data))
                offset, length = placed[key]
                set_external_data(t, WEIGHTS, offset, length)
                t.ClearField("raw_data")
                t.data_location = TensorProto.EXTERNAL
        return f.tell()


def _shape(t) -> list:
    from ...ir import dims as D

    return [d if isinstance(d, int) else D.to_str(d) for d in t.shape]


def describe_entry(graph: Graph, file: str, state: set[str]) -> dict:
    """The manifest entry of one graph: its file, inputs and outputs in order."""
    inputs = set(graph.inputs)

    def io(name: str, onnx_name: str, value: str) -> dict:
        t = graph.types[value]
        d = {"name": onnx_name, "dtype": DTYPE_NAMES[t.dtype], "shape": _shape(t)}
        if name in state:
            d["state"] = name
        return d

    outs = [io(k, PRESENT + k if k in inputs else k, v) for k, v in graph.outputs]
    ins = [io(i, i, i) for i in graph.inputs]
    for ids, rows in id_bounds(graph).items():  # token ids index an embedding table: record its size
        ins[graph.inputs.index(ids)]["bounds"] = [0, rows]
    entry = {"file": file, "inputs": ins, "outputs": outs}
    if "dynamic" in graph.meta:  # a module's capture: the dims it took as dynamic (frontend/dims.py)
        entry["dynamic"] = graph.meta["dynamic"]
    return entry


def build_manifest(graphs: dict[str, Graph], flavour: str, reports: dict, *, model: str | None,
                   config: dict | None, pipeline, opsets: dict[str, int] | None = None,
                   provider: str | None = None) -> dict:
    """`opsets`: each entry's default-domain opset as its model imports it (a fixed-cache decode
    needs 24 for TensorScatter); the manifest's "opset" is the highest, what a runtime must have.
    `provider`: the execution provider the artifact needs (CUDA's for BF16 GEMMs), else None."""
    from ... import __version__

    state = set(graphs["decode"].inputs[1:]) if "decode" in graphs else set()
    dims: dict[str, list] = {}
    for g in graphs.values():
        for n, (lo, hi) in g.dims.items():
            dims.setdefault(n, [lo, hi])
    order = graphs["decode"].inputs[1:] if "decode" in graphs else []
    return {
        "format": FORMAT, "format_version": 1, "k3c_version": __version__,
        "model": model, "config": config, "pipeline": pipeline, "flavour": flavour,
        "opset": max((opsets or {}).values(), default=OPSET), "provider": provider,
        "weights": WEIGHTS, "dims": dims, "state": list(order),
        "entries": {e: {**describe_entry(g, f"{e}.onnx", state), "opset": (opsets or {}).get(e, OPSET)}
                    for e, g in graphs.items()},
        "lowering": {e: {f"{op} -> {target}": n for (op, target), n in sorted(r.items())}
                     for e, r in reports.items()},
    }


def write_artifact(out_dir: Path, models: dict[str, onnx.ModelProto], manifest: dict) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_weights(models, out_dir)
    for entry, model in models.items():
        onnx.save_model(model, str(out_dir / f"{entry}.onnx"))
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out_dir


def read_manifest(out_dir: str | Path) -> dict:
    """The manifest of an ONNX artifact, every field the runner uses checked (check_manifest)."""
    from ..artifact import read

    path = Path(out_dir) / MANIFEST
    if not path.exists():
        raise ArtifactError(f"{out_dir} is not a k3c ONNX artifact: no {MANIFEST}")
    manifest = read(out_dir)
    if manifest is None:
        raise ArtifactError(f"{path}: not a JSON object")
    check_manifest(manifest, path)
    return manifest


def check_manifest(manifest: dict, path: Path) -> dict[str, dict]:
    """Check the fields the runner reads (a ManifestError names the first wrong one); returns
    per entry its input shapes parsed ("shapes") and what its integer inputs index ("limits")."""
    from ..manifest import Fields, symbols

    f = Fields(path)
    f.obj(manifest, "", keys=("format", "entries", "dims"))
    f.version(manifest, FORMAT, (1,))
    dims = f.dims(manifest["dims"], "dims")
    syms = symbols(dims)
    recorded = f.obj(manifest.get("limits", {}), "limits")
    dtypes = tuple(sorted(set(DTYPE_NAMES.values())))
    out = {}
    for entry, spec in f.obj(manifest["entries"], "entries").items():
        where = f"entries.{f.dim_name(entry, 'entries key')}"
        spec = f.obj(spec, where, keys=("file", "inputs", "outputs"))
        f.file(spec["file"], f"{where}.file")
        shapes, ranks, ids = [], {}, {}
        for i, io in enumerate(f.seq(spec["inputs"], f"{where}.inputs")):
            at = f"{where}.inputs[{i}]"
            io = f.obj(io, at, keys=("name", "dtype", "shape"))
            name = f.text(io["name"], f"{at}.name")
            if name in ranks:
                f.fail(f"{at}.name", f"repeats the input {name[:40]!r}")
            f.text(io["dtype"], f"{at}.dtype", choices=dtypes)
            shapes.append(f.shape(io["shape"], f"{at}.shape", syms))
            ranks[name] = len(shapes[-1])
            if "bounds" in io:
                b = f.seq(io["bounds"], f"{at}.bounds")
                if len(b) != 2 or f.integer(b[0], f"{at}.bounds[0]") != 0:
                    f.fail(f"{at}.bounds", "must be [0, rows]")
                ids[name] = f.integer(b[1], f"{at}.bounds[1]", lo=1)
        for i, io in enumerate(f.seq(spec["outputs"], f"{where}.outputs")):
            f.text(f.obj(io, f"{where}.outputs[{i}]", keys=("name",))["name"], f"{where}.outputs[{i}].name")
        if entry in recorded:
            limits = f.limits(recorded[entry], f"limits.{entry}", ranks)
        elif "positions" in ranks or "lengths" in ranks:
            f.fail("limits", f"records nothing for {entry!r}, whose positions or lengths index its caches "
                   f"(compile the artifact again)")
        else:
            limits = {"ids": ids}
        out[entry] = {"shapes": shapes, "limits": limits}
    if not out:
        f.fail("entries", "lists no entry")
    return out
