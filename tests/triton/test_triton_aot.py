"""The Triton backend compiled ahead of time for real GPUs on this machine without one (aot.py).

k3-tiny's module in bf16 and fp32 for sm_90: every kernel it launches (found by running its
entries on meta tensors) compiles with triton's compiler and the wheel's ptxas, none spills,
each fits sm_90's shared memory, and every dot runs on the tensor cores, the GEMM-like ops
(KDA chunk pieces, gated MLP, routed experts, attention) among them. The same at k3-small's
and full K3's shapes in bf16, K3 with 4 of its 93 layers: a dense, three KDA and an MLA layer
with their MoE are every kind of layer K3 has, each kind at one set of shapes, so the kernels
are those of all 93. Then the command line (sm_80), sm_100, and the checker itself on kernels
made to break each rule. Models are built on the meta device: only shapes and dtypes matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import k3c
from k3c.backends.triton import TritonBackend
from k3c.backends.triton.aot import TARGETS, AotReport, compile_kernels, load_report
from k3c.compiler import capture_entries

# IR ops that are GEMMs at heart: each must launch kernels, and their dots must be tensor-core ones
GEMM_LIKE = {"chunk_prepare", "chunk_state_scan", "chunk_output", "gated_mlp", "moe_experts", "mla_attention",
             "mla_attention_absorbed"}
SEQ_LEN = 1024  # prefill length: with decode (T = 1) both tile sizes of the routed experts are taken


def lower_on_meta(name: str, dtype: torch.dtype, out: Path, **overrides) -> Path:
    """Capture model `name` built on the meta device, run the default passes, write its Triton module."""
    model = k3c.models.build(name, dtype=dtype, device="meta", **overrides)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    graphs = {e: k3c.passes.run(g, "default") for e, g in capture_entries(model, (ids,)).items()}
    TritonBackend().lower(graphs, out)
    return out


@pytest.fixture(scope="module")
def aot(tmp_path_factory, zoo):
    """(model, dtype) -> the AotReport for sm_90, compiled once per module. fp32 k3-tiny reuses
    the session's captured graphs (the other Triton tests capture it too)."""
    cache: dict = {}
    os.environ.setdefault("K3C_CACHE_DIR", str(tmp_path_factory.mktemp("aot-cache")))

    def get(name: str, dtype: torch.dtype, **overrides) -> AotReport:
        key = (name, dtype)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{name}-{dtype}".replace("torch.", ""))
            if name == "k3-tiny" and dtype == torch.float32 and not overrides:
                _, prefill, decode = zoo(name)
                graphs = {"prefill": k3c.passes.run(prefill, "default"), "decode": k3c.passes.run(decode, "default")}
                TritonBackend().lower(graphs, out)
            else:
                lower_on_meta(name, dtype, out, **overrides)
            cache[key] = compile_kernels(out, "sm_90", seq_len=SEQ_LEN)
        return cache[key]

    return get


def assert_runs_well(report: AotReport) -> None:
    """Compiles, fits, no spills, every dot on the tensor cores, the GEMM-like ops launch kernels."""
    assert report.kernels, "no kernels were recorded"
    assert not report.problems(), "\n".join(report.problems())
    callers = {c.removeprefix("rt.") for k in report.kernels for c in k["launched_by"]}
    missing = GEMM_LIKE - callers
    assert not missing, f"GEMM-like ops that launched no kernel: {sorted(missing)}"
    for k in report.kernels:
        if set(k["launched_by"]) & GEMM_LIKE and k["dots"]:
            assert k["tensor_cores"] in ("wgmma", "mma"), f"{k['name']} {k['constexprs']}: {k['tensor_cores']}"
        if k["tensor_core_sass"] is not None:  # the SASS agrees with the PTX
            assert (k["tensor_core_sass"] > 0) == (k["tensor_cores"] is not None), k["name"]
    assert any(k["tensor_core_sass"] for k in report.kernels)
    # what each row says came from the cubin on disk
    for k in report.kernels:
        assert (report.path.parent / k["cubin"]).stat().st_size > 0


# bf16 is the GPU's form; fp32 (3xTF32 dots, the tiles that spilled) is the slow tier's
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.slow)],
                         ids=["bf16", "fp32"])
def test_k3_tiny_compiles_for_sm90_without_spills_on_tensor_cores(aot, dtype):
    report = aot("k3-tiny", dtype)
    assert_runs_well(report)
    kinds = {kind for k in report.kernels for kind in k["dot_kinds"]}
    # fp32 dots follow torch's precision ("highest": 3xTF32); bf16 operands go as they are
    assert "ieee" not in kinds
    assert ("bf16" in kinds) == (dtype == torch.bfloat16)


def test_roofline_rows_map_ops_to_their_kernels(aot):
    """k3-tiny's fp32 RMSNorm over d = 256 without a weight reads x and writes y once (2 * 4 bytes
    an element by the definition of the cost model's bytes), far below any ridge: memory-bound at
    H200's 4.8 TB/s; the KDA pieces name the kernels they launch."""
    from k3c.backends.triton.roofline import H200, roofline

    T = 1024
    rows = roofline(aot("k3-tiny", torch.float32).path.parent, {"B": 1, "T": T, "P": T})
    norm = [r for r in rows if r.entry == "prefill" and r.op == "rms_norm" and r.shape == f"1x{T}x256"
            and r.bytes == 2 * T * 256 * 4]
    assert len(norm) == 1 and norm[0].kernels == ("rmsnorm_kernel",) and norm[0].bound(H200) == "memory"
    assert norm[0].seconds(H200) == pytest.approx(2 * T * 256 * 4 / 4.8e12)
    prepare = next(r for r in rows if r.entry == "prefill" and r.op == "chunk_prepare")
    assert {"chunk_decay_kernel", "chunk_scores_kernel", "chunk_wy_kernel"} <= set(prepare.kernels)
    assert prepare.nodes == 6 and prepare.dot == "tf32x3"  # k3-tiny's six KDA layers


# K3's shapes run in CI; k3-small's (the same kernels at middling shapes) in the slow tier
@pytest.mark.parametrize("name,overrides", [pytest.param("k3-small", {}, marks=pytest.mark.slow),
                                            ("k3", {"num_layers": 4, "mla_layers": (4,)})], ids=["k3-small", "k3"])
def test_model_shapes_compile_for_sm90(aot, name, overrides):
    assert_runs_well(aot(name, torch.bfloat16, **overrides))


def test_cli_compiles_for_sm80_then_the_artifact_for_sm100(tmp_path):
    """`k3c compile --target sm_80`: cubins beside the module, kernels.json with its fields,
    mma.sync (sm_80's tensor cores) for the attention's dots; then the same artifact for sm_100."""
    out = tmp_path / "gpt2"
    r = subprocess.run([sys.executable, "-m", "k3c.cli", "compile", "--model", "gpt2-tiny", "--backend", "triton",
                        "--target", "sm_80", "--seq-len", "256", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((out / "kernels.json").read_text())
    assert {"name", "constexprs", "num_warps", "num_stages", "registers", "spill_bytes", "shared_bytes",
            "tensor_cores"} <= set(rows[0])
    report = load_report(out)
    assert report.target is TARGETS["sm_80"] and not report.problems(), report.problems()
    attention = [k for k in rows if "causal_attention" in k["launched_by"]]
    assert attention and all(k["tensor_cores"] == "mma" for k in attention)
    assert "flash_attention_kernel" in r.stdout  # the table printed per kernel

    report = compile_kernels(out, "sm_100", seq_len=256)
    assert report.target is TARGETS["sm_100"] and not report.errors(), report.errors()
    assert {k["tensor_cores"] for k in report.kernels if k["dots"]} <= {"tcgen05", "wgmma", "mma"}
    assert len(list((out / "sm_100").glob("*.cubin"))) == len(report.kernels)


def test_an_unknown_target_is_one_line_before_any_work(capsys):
    from k3c.cli import main

    assert main(["compile", "--model", "k3", "--backend", "triton", "--target", "sm_75"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["k3c compile: error: triton: unknown GPU target 'sm_75'; known: sm_80, sm_90, sm_100"]
    with pytest.raises(ValueError, match="unknown GPU target"):
        TritonBackend(target="sm_75")


# Kernels made to break one rule each, compiled through the same recorder and build step.
BROKEN = '''
import json, sys
from pathlib import Path
import torch
import triton
import triton.language as tl
from k3c.backends.triton.aot import target
from k3c.backends.triton.aot_build import build, count_sass_tensor_ops
from k3c.backends.triton.aot_record import Recorder


@triton.jit
def spills(x, y, N: tl.constexpr):  # a 128 x 128 fp32 block on one warp: 512 values a thread
    o = tl.arange(0, N)
    b = tl.load(x + o[:, None] * N + o[None, :])
    tl.store(y + o[:, None] * N + o[None, :], tl.cumsum(b, axis=0) * tl.cumsum(b, axis=1))


@triton.jit
def fp32_dot(x, y, N: tl.constexpr, PREC: tl.constexpr):  # "ieee": FMAs, no tensor cores
    o = tl.arange(0, N)
    b = tl.load(x + o[:, None] * N + o[None, :])
    tl.store(y + o[:, None] * N + o[None, :], tl.dot(b, b, input_precision=PREC))


@triton.jit
def too_much_shared(x, y, K, N: tl.constexpr):  # 256 x 256 bf16 tiles, 4 stages: 512 KB
    o = tl.arange(0, N)
    acc = tl.zeros([N, N], dtype=tl.float32)
    for k in range(0, K, N):
        a = tl.load(x + o[:, None] * K + k + o[None, :])
        acc = tl.dot(a, tl.trans(a), acc)
    tl.store(y + o[:, None] * N + o[None, :], acc)


@triton.jit
def redefines(x, y, T, N: tl.constexpr):  # the interpreter runs this; the compiler does not
    o = tl.arange(0, N)
    b = tl.load(x + o)
    if T > 0:
        o = T
    tl.store(y + o, b)


tgt = target("sm_90")
meta = lambda n, dt=torch.float32: torch.empty(n, dtype=dt, device="meta")
rec = Recorder(tgt.gpu_target())
with rec.intercepting():
    spills[(1,)](meta(128 * 128), meta(128 * 128), N=128, num_warps=1)
    fp32_dot[(1,)](meta(32 * 32), meta(32 * 32), N=32, PREC="ieee")
    fp32_dot[(1,)](meta(32 * 32), meta(32 * 32), N=32, PREC="tf32x3")
    too_much_shared[(1,)](meta(256 * 4096, torch.bfloat16), meta(256 * 256), 4096, N=256, num_stages=4)
    redefines[(1,)](meta(16), meta(16), 3, N=16)
out = Path(sys.argv[1])
(out / tgt.name).mkdir(parents=True)
rows = [build(launch, tgt, out / tgt.name) for launch in rec.launches.values()]
for row in rows:
    count_sass_tensor_ops([row], out)
(out / "kernels.json").write_text(json.dumps(rows))
'''


def test_the_checks_catch_spills_fma_dots_shared_memory_and_compile_errors(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent(BROKEN))
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="0"))
    assert r.returncode == 0, r.stderr[-2000:]
    report = load_report(tmp_path)
    rows = {(k["name"], k["constexprs"].get("PREC")): k for k in report.kernels}
    assert rows[("spills", None)] in report.spilled()
    assert rows[("fp32_dot", "ieee")] in report.dots_off_tensor_cores()
    assert rows[("fp32_dot", "ieee")]["dot_kinds"] == ["ieee"]
    tf32x3 = rows[("fp32_dot", "tf32x3")]
    assert tf32x3["tensor_cores"] in ("wgmma", "mma") and tf32x3["tensor_core_sass"] > 0
    assert tf32x3["dot_kinds"] == ["tf32x3"]
    assert tf32x3 not in report.dots_off_tensor_cores() + report.spilled()
    assert rows[("too_much_shared", None)] in report.over_shared()
    broken = rows[("redefines", None)]
    assert not broken["ok"] and broken["constexprs"] == {"N": 16} and "redefines it" in broken["error"]
    errors = report.errors()
    assert len(errors) == 2 and any(e.startswith("redefines {N=16}: does not compile for sm_90") for e in errors)
