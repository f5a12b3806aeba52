"""The Triton kernels at the tiles a GPU runs them at, under the interpreter.

The interpreter runs a kernel at its interpreter tile (kernels/common/triton: autotune's
`interpreted`, the rows per program, the chunk split of the scores), larger than a GPU's
registers hold, because it pays per operation and per program. A larger tile can skip a code
path a GPU takes (the scores' blocks left of the diagonal when a program holds the whole
chunk), so these run the awkward cases of the kernel tests again inside `gpu_tiles()`, against
the same naive definitions."""

from __future__ import annotations

import pytest
import test_triton_attention as attention
import test_triton_kda as kda
import test_triton_layers as layers
import torch
from triton_inputs import delta

from k3c.ir import OPS
from k3c.kernels.common.triton import gpu_tiles, interpreter_tiles, rows_per_program
from k3c.kernels.delta.triton import chunk_prepare
from k3c.kernels.short_conv.triton.depthwise import short_conv_kernel
from k3c.kernels.situ.triton.epilogue import gated_gemm_kernel
from k3c.numerics import assert_close

f32 = torch.float32


@pytest.fixture
def at_gpu_tiles():
    with gpu_tiles():
        yield


def test_gpu_tiles_switch_every_choice_and_back():
    assert interpreter_tiles()
    assert short_conv_kernel.configs[0].kwargs == {"BT": 256, "BC": 128}
    assert rows_per_program(1000, 64)[0] == 256
    with gpu_tiles():
        assert not interpreter_tiles()
        assert short_conv_kernel.configs[0].kwargs == {"BT": 64, "BC": 64}  # the GPU's first config
        assert rows_per_program(1000, 64)[0] == 64  # 4096 values a program
    assert interpreter_tiles() and short_conv_kernel.configs[0].kwargs == {"BT": 256, "BC": 128}


@pytest.mark.parametrize("rows, bm", [(1, 16), (16, 16), (40, 64), (64, 64), (65, 64), (1000, 256)])
def test_interpreter_tiles_follow_the_rows(rows, bm):
    """A ByRows kernel takes, under the interpreter, the largest row block its rows need (a
    decode step's one row not in a 256-row tile), without timing anything; a GPU's first
    config inside gpu_tiles()."""
    pick = gated_gemm_kernel.early_config_prune
    assert [c.kwargs["BM"] for c in gated_gemm_kernel.configs] == [16, 64, 256]
    assert [c.kwargs["BM"] for c in pick(gated_gemm_kernel.configs, {"M": rows})] == [bm]
    with gpu_tiles():
        assert [c.kwargs for c in gated_gemm_kernel.configs] == [{"BM": 64, "BN": 64, "BK": 64}]
    assert len(gated_gemm_kernel.configs) == 3


@pytest.mark.parametrize("gate", ["channel", "head", "none"])
def test_chunk_pieces_at_both_tiles_equal_the_reference(gate):
    """chunk_prepare at C = 64 over 130 steps (three chunks, the last of two steps): the whole
    chunk in one program (the interpreter's tile) and four 16-row blocks (a GPU's) each equal
    the IR op's reference."""
    x = delta(130, 48, 32, gate=gate, seed=7)
    args = [x.q, x.k, x.v, x.beta] + ([x.g] if x.g is not None else [])
    ref = OPS["chunk_prepare"].ref(*args, chunk_size=64, gate=gate)
    got = {"interpreter": chunk_prepare(x.q, x.k, x.v, x.beta, x.g, 64, gate)}
    with gpu_tiles():
        got["gpu"] = chunk_prepare(x.q, x.k, x.v, x.beta, x.g, 64, gate)
    for tiles, outs in got.items():
        for name, a, b in zip(("q_decayed", "k_decayed", "w", "u", "aqk", "decay_last"), outs, ref):
            assert_close(a, b, what=f"chunk_prepare {name} at {tiles} tiles")


@pytest.mark.usefixtures("at_gpu_tiles")
@pytest.mark.parametrize("T", [65, 130])
def test_chunked_kda_at_gpu_tiles(T):
    kda.test_chunk_kda_equals_recurrent_definition(T, 32, f32)


@pytest.mark.usefixtures("at_gpu_tiles")
def test_strong_decay_at_gpu_tiles():
    kda.test_strong_decay_stays_finite_and_exact(64)


@pytest.mark.usefixtures("at_gpu_tiles")
@pytest.mark.parametrize("T", [1, 65])
def test_short_conv_at_gpu_tiles(T):
    layers.test_short_conv_with_state(T, 48, f32, "silu")


@pytest.mark.usefixtures("at_gpu_tiles")
def test_gated_mlp_at_gpu_tiles():
    layers.test_gated_mlp_fuses_the_activation_into_the_gemm(65, 48, f32, "situ")


@pytest.mark.usefixtures("at_gpu_tiles")
def test_row_kernels_at_gpu_tiles():
    layers.test_rms_norm(48, f32, True)
    layers.test_attn_res_mix(65, 48, f32, 4)


@pytest.mark.usefixtures("at_gpu_tiles")
def test_mla_prefill_at_gpu_tiles():
    attention.test_mla_prefill(65, 5, 48, f32)
