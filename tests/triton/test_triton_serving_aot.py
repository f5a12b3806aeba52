"""The Triton serving kernels (cache_write, the split-K cached attention and its merge) at K3's
shapes and a 1M-token cache, ahead of time for sm_90 and sm_100 with the wheel's ptxas (no GPU
needed; tests/triton/serving_aot_script.py records and compiles them):

- every grid fits CUDA's launch limits (x < 2^31, y and z <= 65535): recorded in the default
  tier (seconds), compiled in the slow one (about a minute a target on 2 shared cores);
- every kernel compiles, spills nothing, fits the target's shared memory;
- no int32 product of two run-time values (an index times a stride) in any kernel's TTIR: at
  a 1M-row cache b * N * 576 and t * H * 512 pass 2^31, so those offsets are int64. A kernel
  written with int32 offsets is recorded beside them and must be caught.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3c.backends.triton.aot import GRID_YZ, TARGETS, AotReport, grid_fits

SCRIPT = Path(__file__).with_name("serving_aot_script.py")
SERVING = {"cache_write_kernel", "cached_split_kernel", "cached_merge_kernel"}


def rows_for(target: str, out: Path, *flags: str) -> list[dict]:
    r = subprocess.run([sys.executable, str(SCRIPT), str(out), target, *flags], capture_output=True, text=True,
                       timeout=1200, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def check_grids(rows: list[dict]) -> None:
    assert {r["name"] for r in rows} >= SERVING
    for r in rows:
        assert grid_fits(r["grid"]), (r["name"], r["grid"], r["cases"])
    # the 1M cache is really there: a 1M-token prefill's write has a row a program
    assert max(r["grid"][0] for r in rows if r["name"] == "cache_write_kernel") == 1 << 20
    # a decode step of one sequence splits its keys (a second kernel merges them)
    split = [r for r in rows if r["name"] == "cached_split_kernel" and not r["constexprs"]["DIRECT"]]
    assert split and max(r["grid"][1] for r in split) > 1


def test_serving_kernels_grids_at_1m_context(tmp_path):
    check_grids(rows_for("sm_90", tmp_path, "--record-only"))


def test_a_grid_past_the_limits_is_an_aot_error(tmp_path):
    """kernels.json's grid is checked: a (1, 65536, 1) launch cannot run, (2^31 - 1, 1, 1) can."""
    row = {"name": "k", "constexprs": {}, "ok": True, "shared_bytes": 0, "spill_bytes": 0, "local_bytes": 0}
    report = AotReport(TARGETS["sm_90"], [{**row, "grid": [1, GRID_YZ + 1, 1]}, {**row, "grid": [2**31 - 1, 1, 1]}],
                       tmp_path / "kernels.json")
    assert report.errors() == ["k {}: grid (1, 65536, 1) is past CUDA's launch limits (2147483647, 65535, 65535)"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_100"])
def test_serving_kernels_compile_without_spills_or_int32_offsets(tmp_path, target):
    rows = rows_for(target, tmp_path)
    check_grids(rows)
    mine = [r for r in rows if r["name"] in SERVING]
    for r in mine:
        what = f"{r['name']} {r['constexprs']} ({', '.join(r['cases'])})"
        assert r["ok"], f"{what}: {r.get('error')}"
        assert r["spill_bytes"] == 0 and r["local_bytes"] == 0, f"{what}: spills {r['spill_bytes']} bytes"
        assert r["shared_bytes"] <= TARGETS[target].shared_limit, f"{what}: {r['shared_bytes']} bytes shared"
        assert r["i32_products"] == [], f"{what}: int32 offsets {r['i32_products']}"
        if r["dots"]:
            assert r["tensor_cores"], f"{what}: dots off the tensor cores"
    # the check finds an int32 offset where there is one
    broken = next(r for r in rows if r["name"] == "int32_offsets")
    assert broken["ok"] and broken["i32_products"], broken
