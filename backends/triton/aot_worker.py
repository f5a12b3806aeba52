"""The AOT worker process: record the kernels a Triton artifact launches, compile each for a
GPU target, write DIR/kernels.json and the cubins (see aot.py, which starts it).

    TRITON_INTERPRET=0 python -m k3c.backends.triton.aot_worker DIR --target sm_90 --seq-len 8192

It must start with TRITON_INTERPRET=0 in its environment (k3c chooses the mode when it is
first imported, which `python -m` does before this module runs). Distinct kernels compile in
a pool of forked processes (they inherit the imported module and its JITFunctions); a row
cache keyed by the kernel's compile key (source, specialisation, constexprs, options, target,
triton version) skips kernels compiled before, in this run or an earlier one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

CACHE_VERSION = "2"  # bump when a kernels.json row changes meaning
_LAUNCHES: list = []  # the kernels to compile, shared with forked pool processes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="aot_worker")
    p.add_argument("dir")
    p.add_argument("--target", default="sm_90")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--precision", default="highest")
    p.add_argument("--only", action="append", help="compile only the kernels of this function (repeatable)")
    args = p.parse_args(argv)

    from ...kernels.common.triton_mode import interpreted

    if interpreted():
        print("aot_worker: TRITON_INTERPRET=0 must be set before k3c is imported", file=sys.stderr)
        return 2
    import torch

    torch.set_float32_matmul_precision(args.precision)
    from .aot import KERNELS_JSON, target
    from .aot_record import record_artifact

    tgt = target(args.target)
    out = Path(args.dir)
    t0 = time.perf_counter()
    try:
        launches = record_artifact(out, tgt.gpu_target(), seq_len=args.seq_len, batch=args.batch)
    except Exception as e:  # noqa: BLE001  (a module that cannot run on meta tensors: say where)
        print(f"aot_worker: {e}", file=sys.stderr)
        return 2
    if args.only:
        launches = [k for k in launches if k.name in args.only]
    recorded = time.perf_counter() - t0
    cubins = out / tgt.name
    shutil.rmtree(cubins, ignore_errors=True)
    cubins.mkdir(parents=True)
    rows = _build_all(launches, tgt, cubins, args.jobs)
    rows.sort(key=lambda r: (r["name"], json.dumps(r["constexprs"], sort_keys=True, default=str),
                             r["num_warps"], r["num_stages"], json.dumps(r["signature"])))
    from .aot_build import count_sass_tensor_ops

    count_sass_tensor_ops(rows, out)
    (out / KERNELS_JSON).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    print(f"aot_worker: {len(rows)} kernels for {tgt.name}, recorded in {recorded:.1f}s, "
          f"compiled in {time.perf_counter() - t0 - recorded:.1f}s", file=sys.stderr)
    return 0


def _build_all(launches: list, tgt, cubins: Path, jobs: int) -> list[dict]:
    rows: list[dict | None] = [None] * len(launches)
    todo = []
    for i, launch in enumerate(launches):
        cached = _cache_get(launch, tgt, cubins)
        if cached is not None:
            rows[i] = cached
        else:
            todo.append(i)
    _LAUNCHES[:] = launches
    if jobs > 1 and len(todo) > 1:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(todo))) as pool:
            built = pool.starmap(_build_one, [(i, tgt, cubins) for i in todo], chunksize=1)
    else:
        built = [_build_one(i, tgt, cubins) for i in todo]
    for i, row in zip(todo, built):
        rows[i] = row
        _cache_put(launches[i], tgt, cubins, row)
    return rows


def _build_one(i: int, tgt, cubins: Path) -> dict:
    from .aot_build import build

    return build(_LAUNCHES[i], tgt, cubins)


# ---- the row cache ----------------------------------------------------------------------
# What a row says about how the kernel was launched (cases, callers) is this run's; what the
# compiler produced is the cache's.
_LAUNCH_FIELDS = ("launched_by", "cases", "launches", "grid")


def _cache_dir() -> Path:
    root = os.environ.get("K3C_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "k3c")
    return Path(root) / "triton-aot"


def _cache_key(launch, tgt) -> str:
    import triton

    text = f"{CACHE_VERSION}-{triton.__version__}-{tgt.name}-{launch.key}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cache_get(launch, tgt, cubins: Path) -> dict | None:
    base = _cache_dir() / _cache_key(launch, tgt)
    try:
        row = json.loads(base.with_suffix(".json").read_text())
        if row.get("ok"):
            shutil.copyfile(base.with_suffix(".cubin"), cubins / Path(row["cubin"]).name)
    except (OSError, ValueError):
        return None
    row.update(launched_by=launch.callers, cases=launch.cases, launches=launch.launches, grid=launch.grid,
               cached=True)
    return row


def _cache_put(launch, tgt, cubins: Path, row: dict) -> None:
    base = _cache_dir() / _cache_key(launch, tgt)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        if row.get("ok"):
            shutil.copyfile(cubins / Path(row["cubin"]).name, base.with_suffix(".cubin"))
        kept = {k: v for k, v in row.items() if k not in _LAUNCH_FIELDS}
        tmp = base.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, default=str))
        tmp.replace(base.with_suffix(".json"))
    except OSError:  # a cache that cannot be written only costs time
        pass


if __name__ == "__main__":
    sys.exit(main())
