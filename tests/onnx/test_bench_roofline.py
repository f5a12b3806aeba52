"""benchmarks/bench_roofline_cpu.py in its quick mode: the script runs end to end and its
table and JSON carry every field (speeds are not checked)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_roofline_cpu.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_roofline_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # compiles four k3-tiny artifacts (fp32 and release, prefill and decode): minutes
def test_quick_mode_reports_every_field(tmp_path):
    bench = load_script()
    out = tmp_path / "roofline.json"
    result = bench.main(["--quick", "--layers", "2", "--backends", "onnx:ort", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    assert result["model"] == "k3-tiny" and result["prefill_tokens"] == 64 and result["decode_steps"] == 4
    machine = result["machine"]
    assert machine["name"] and all(isinstance(machine[f], bool) for f in bench.FLAGS)
    y = result["yardsticks"]
    assert y["read_bytes_per_s"] > 0 and y["gemm_flops_per_s"]["fp32"] > 0 and y["gemm_flops_per_s"]["bf16"] > 0
    assert y["read_pages"] in ("2 MB pages", "4 KB pages") and y["read_bytes_per_s_4k_pages"] > 0
    rows = {(r["backend"], r["precision"]): r for r in result["rows"]}
    assert set(rows) == {("onnx:ort", "fp32"), ("onnx:ort", "bf16+mxfp4")}
    for r in rows.values():
        assert r["machine"] == machine["label"] and r["peak"] == "fp32"  # both compute in float32
        assert r["prefill_seconds"] > 0 and r["prefill_flops"] > 0 and r["prefill_share_of_peak"] > 0
        for b in bench.BATCHES:
            d = r["decode"][str(b)]
            assert d["seconds"] > 0 and d["bytes_read"] > 0
            assert d["multiple_of_floor"] == d["seconds"] / d["floor_seconds"]
            # beside it, the floor at the bandwidth read just before the turn the step was fastest in
            assert d["turn_read_bytes_per_s"] > 0
            assert d["multiple_of_turn_floor"] == d["seconds"] * d["turn_read_bytes_per_s"] / d["bytes_read"]
            # the roofline: the larger of the bytes floor and the FLOPs at the fp32 GEMM rate
            assert d["flops"] == b * r["decode"]["1"]["flops"] > 0
            assert d["compute_floor_seconds"] == d["flops"] / y["gemm_flops_per_s"]["fp32"]
            assert d["roofline_seconds"] == max(d["floor_seconds"], d["compute_floor_seconds"])
            assert d["multiple_of_roofline"] <= d["multiple_of_floor"]
    assert y["read_bytes_per_s_at_end"] > 0
    # the release holds its experts in fewer bytes, so it reads fewer per step
    read = {prec: rows[("onnx:ort", prec)]["decode"]["8"]["bytes_read"] for prec in ("fp32", "bf16+mxfp4")}
    assert read["bf16+mxfp4"] < read["fp32"]
    header, rule, *body = result["table"].splitlines()
    assert header.startswith("| backend | precision |") and set(rule) <= set("|-") and len(body) == 2
    assert all(machine["label"] in line for line in body)
