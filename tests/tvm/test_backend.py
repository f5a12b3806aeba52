"""The TVM backend as a user meets it: errors that name what is wrong, the `cuda` target
building without a GPU, `k3c show --backend tvm`, `k3c compile --backend tvm` and
`k3c.compile(..., backend="tvm")`."""

from __future__ import annotations

import json

import pytest
import torch
from factories import example_ids

import k3c
from k3c.backends import UnsupportedNodeError, check_supported
from k3c.backends.tvm import TvmBackend, TvmRunner
from k3c.cli import main
from k3c.ir import OPS, InputError
from k3c.ir.ops.spec import defop
from k3c.numerics import assert_close


@pytest.fixture
def unknown_op():
    """An op declared for this test only, with a reference but no TVM lowering."""
    defop("test_only_cumsum", "x", infer=lambda x: [x], ref=lambda x: x.cumsum(-1), doc="test only")
    yield "test_only_cumsum"
    del OPS["test_only_cumsum"]


def test_op_without_lowering_is_an_error_naming_it(unknown_op):
    g = k3c.ir.parse("""graph g {
  dim B in [1, inf]
  input %x: f32[B, 8]
  %y: f32[B, 8] = test_only_cumsum(%x)  # models/somewhere.py:12
  %z: f32[B, 8] = sigmoid(%y)
  output z = %z
}
""")
    with pytest.raises(UnsupportedNodeError) as e:
        check_supported(TvmBackend(), g)
    msg = str(e.value)
    assert "'tvm'" in msg and "test_only_cumsum" in msg and "models/somewhere.py:12" in msg
    assert "no tvm lowering" in msg and "sigmoid" not in msg


def test_kernel_dtype_is_an_error_naming_the_value():
    g = k3c.ir.parse("""graph g {
  dim B in [1, inf]
  input %x: bf16[B, 4, 8]
  input %s: bf16[B, 8, 3]
  weight %w: bf16[8, 4]
  %y: bf16[B, 4, 8], %s2: bf16[B, 8, 3] = short_conv(%x, %w, %s)
  output y = %y
}
""")
    ok, why = TvmBackend().supports(g.nodes[0], g)
    assert not ok and "f32" in why and "bf16" in why


@pytest.fixture(scope="module")
def small(tvm_zoo):
    return tvm_zoo("linear-attn-tiny")


@pytest.mark.parametrize("bad, words", [
    (lambda ids: ids.to(torch.int32), ["input_ids", "i64", "int32"]),
    (lambda ids: ids[0], ["input_ids", "expected i64[B, T]"]),
    (lambda ids: ids + 10**6, ["input_ids", "is outside [0, 1024)"]),
], ids=["dtype", "rank", "id-range"])
def test_bad_input_names_the_input(small, bad, words):
    model, graphs, out, runner = small
    with pytest.raises(InputError) as e:
        runner.run("prefill", bad(example_ids(model, 2, 5)))
    for w in words:
        assert w in str(e.value)


def test_bad_state_shape_names_the_state(small):
    model, graphs, out, runner = small
    logits, *state = runner.run("prefill", example_ids(model, 2, 5))
    state[0] = state[0][:, :, :, :-1]
    with pytest.raises(InputError, match=r"input 'layers\.0\.S'.*dim 3 is"):
        runner.run("decode", example_ids(model, 2, 1), *state)


def test_the_vm_matches_shapes_without_the_kernels_asserts(small):
    """The kernels are built without their argument checks (build.without_kernel_asserts):
    called past the runner's checks, the VM's own matching of an entry's inputs still stops
    a state of the wrong shape with an error naming it, before any kernel runs."""
    model, graphs, out, runner = small
    logits, *state = runner.run("prefill", example_ids(model, 2, 5))
    state[0] = state[0][:, :, :, :-1].contiguous()
    args = [runner._to_tvm(x) for x in (example_ids(model, 2, 1), *state)]
    with pytest.raises(Exception, match=r"(?i)shape|dim") as e:
        runner._vm["decode"](*args, *runner._params)
    assert "decode" in str(e.value)


def test_artifact_is_the_library_the_weights_and_a_manifest(small):
    model, graphs, out, runner = small
    assert sorted(p.name for p in out.iterdir()) == ["lib.so", "manifest.json", "weights.safetensors"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"] == "llvm" and set(m["entries"]) == {"prefill", "decode"}
    assert [i["name"] for i in m["entries"]["decode"]["inputs"]] == graphs["decode"].inputs
    assert m["weights"] == sorted(set(graphs["prefill"].weights) | set(graphs["decode"].weights))


_POOL = """
import os, sys, torch, tvm_ffi
from k3c.backends.tvm import TvmRunner
TvmRunner(sys.argv[1]).run("prefill", torch.zeros(1, 3, dtype=torch.int64))
print(tvm_ffi.get_global_func("runtime.NumThreads")(), len(os.sched_getaffinity(0)))
"""


@pytest.mark.parametrize("preset", [None, "1"], ids=["default", "TVM_NUM_THREADS=1"])
def test_runner_sizes_the_thread_pool_to_the_cpus(small, preset):
    """TVM alone takes half the hardware threads on x86; the runner gives it every CPU this
    process may use, unless TVM_NUM_THREADS is set (fresh processes: the pool is global)."""
    import os
    import subprocess
    import sys

    _, _, out, _ = small
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    if preset:
        env["TVM_NUM_THREADS"] = preset
    got = subprocess.run([sys.executable, "-c", _POOL, str(out)], env=env, capture_output=True, text=True, check=True)
    threads, cpus = (int(x) for x in got.stdout.split())
    assert threads == (int(preset) if preset else cpus)


@pytest.mark.slow  # a CUDA build of the whole model: a minute here, and no GPU to run it
def test_cuda_target_builds_k3_tiny(tvm_zoo, tmp_path):
    """Code generation for cuda needs no GPU: the library and its CUDA source are written."""
    model, graphs, _, _ = tvm_zoo("k3-tiny")
    out = TvmBackend(target="cuda").lower(graphs, tmp_path)
    assert (out / "lib.so").stat().st_size > 0
    source = (out / "kernels.cu").read_text()
    assert source.count("__global__") > 20
    for kernel in ("chunk_scores", "chunk_state_scan", "delta_recurrent", "short_conv", "attn_res_mix",
                   "moe_gate_up", "mla_latent_attention", "situ_packed"):
        assert kernel in source, kernel
    assert "blockIdx.x" in source and "threadIdx.x" in source
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="built for cuda, and there is no cuda device here"):
            TvmRunner(out).run("prefill", example_ids(model, 1, 3))


def test_show_prints_the_scheduled_tir(capsys):
    assert main(["show", "--model", "linear-attn-tiny", "--backend", "tvm", "--entry", "decode"]) == 0
    text = capsys.readouterr().out
    assert "T.prim_func" in text and "linear_recurrent" in text and "def decode" in text
    assert "T.parallel" in text and "T.vectorized" in text


def test_compile_cli_and_api(tmp_path, capsys):
    assert main(["compile", "--model", "gated-deltanet-tiny", "--backend", "tvm", "--out", str(tmp_path),
                 "--target", "llvm"]) == 0
    model = k3c.models.build("gated-deltanet-tiny")
    ids = example_ids(model, 2, 9, seed=5)
    runner = TvmRunner(tmp_path)
    with torch.no_grad():
        assert_close(runner.run("prefill", ids)[0], model(ids), what="k3c compile artifact")
        compiled = k3c.compile(model, "tvm", (ids,), out_dir=tmp_path / "api")
        assert_close(compiled(ids), model(ids), what="k3c.compile(..., backend='tvm')")


def test_every_ir_op_has_a_tvm_lowering_or_a_decomposition():
    from k3c.backends import tables

    table = tables.load("tvm")
    # collectives run between a rank's segments (k3c.distributed), never inside a backend's graph
    assert sorted(op for op in OPS if op not in table and OPS[op].decompose is None
                  and "collective" not in OPS[op].families) == []
