"""The ort flavour's release-precision experts: the exact 8-bit forms of MXFP4 blocks, and
the decode step's choice between the gathered route (int8 codes, blocked DequantizeLinear, one
batched MatMul) and the sorted one (one MatMulNBits per expert).

Checked against independent definitions: the 8-bit encodings decoded as MatMulNBits' format
documents it and as ONNX's DequantizeLinear defines it (numpy, and onnx's reference
evaluator), equal to the MXFP4 decode of kernels/mxfp4 bit for bit (but for -0, which becomes
+0); and a BF16 + MXFP4 k3-tiny compiled for onnx:ort against eager float32 on the same
weights (models.precision.fp32_copy), at the fp32 row.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper as oh
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import k3c
from k3c.backends.onnx.ort_mxfp4 import ZERO_POINT_8, int8_blocks, nbits8
from k3c.kernels.mxfp4.naive import decode
from k3c.models.precision import fp32_copy
from k3c.numerics import assert_close


def every_block() -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales that reach every byte and every E8M0 value (K = 512)."""
    rng = np.random.default_rng(0)
    packed = np.concatenate([np.tile(np.arange(256, dtype=np.uint8), (256, 1)),
                             rng.integers(0, 256, (64, 256), dtype=np.uint8)])
    scale = np.concatenate([np.repeat(np.arange(256, dtype=np.uint8)[:, None], 16, 1),
                            rng.integers(0, 256, (64, 16), dtype=np.uint8)])
    return packed, scale


def same_weights(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit but for -0, which an integer code cannot hold (+0 there); NaN where the
    scale byte is 255."""
    neg_zero = (want == 0) & np.signbit(want)
    bits = lambda a: a.view(np.uint32)  # noqa: E731
    return bool(np.array_equal(bits(got)[~neg_zero], bits(want)[~neg_zero]) and (got[neg_zero] == 0).all())


def matmulnbits8_weights(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """MatMulNBits' format for bits=8 and no zero-point input: B [N, K/32, 32] holds one code a
    byte along K, w = (q - 2^(8-1)) * scale of its block -> [N, K] (float64, then float32)."""
    N, blocks, blob = q.shape
    w = (q.astype(np.float64) - 128.0) * scale.astype(np.float64)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        return w.reshape(N, blocks * blob).astype(np.float32)


def test_the_matmulnbits_8bit_encoding_decodes_to_the_mxfp4_weights():
    packed, scale = every_block()
    q, s = nbits8(torch.from_numpy(packed), torch.from_numpy(scale))
    assert ZERO_POINT_8 == 128 and q.dtype == torch.uint8 and s.dtype == torch.float32
    assert q.shape == (320, 16, 32) and s.shape == (320, 16)
    want = decode(torch.from_numpy(packed), torch.from_numpy(scale)).numpy()
    assert np.isnan(want).any() and np.isinf(want).any() and (np.signbit(want) & (want == 0)).any()
    got = matmulnbits8_weights(q.numpy(), s.numpy())
    # e = 254 with code 6: 6 * 2^127 overflows to inf in the decode; 12 * 2^126 does too in float32
    assert same_weights(got, want)


def test_the_dequantizelinear_blocks_decode_to_the_mxfp4_weights():
    packed, scale = every_block()
    t, s = int8_blocks(torch.from_numpy(packed)[None], torch.from_numpy(scale)[None])
    assert t.dtype == torch.int8 and s.dtype == torch.float32 and t.shape == (1, 512, 320) and s.shape == (1, 16, 320)
    want = decode(torch.from_numpy(packed), torch.from_numpy(scale)).numpy().T  # W^T [K, N]
    # DequantizeLinear's definition (opset 21+, blocked): y = x * scale[k // block]
    with np.errstate(invalid="ignore", over="ignore"):
        by_definition = (t[0].numpy().astype(np.float32) * np.repeat(s[0].numpy(), 32, axis=0))
    assert same_weights(np.ascontiguousarray(by_definition), np.ascontiguousarray(want))
    node = oh.make_node("DequantizeLinear", ["t", "s"], ["y"], axis=1, block_size=32)
    graph = oh.make_graph([node], "g", [], [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(t.numpy(), "t"), numpy_helper.from_array(s.numpy(), "s")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 23)])
    with np.errstate(invalid="ignore", over="ignore"):
        (y,) = ReferenceEvaluator(model).run(None, {})
    assert same_weights(np.ascontiguousarray(y[0], dtype=np.float32), np.ascontiguousarray(want))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    model = k3c.models.build("k3-tiny", seed=3, dtype=torch.bfloat16, experts="mxfp4", num_layers=2)
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    out = tmp_path_factory.mktemp("release") / "artifact"
    return model, k3c.compile(model, "onnx", (ids,), out_dir=out, flavour="ort")


def op_types(graph: onnx.GraphProto) -> list[str]:
    """Every node's op type, inside If branches too."""
    ops = []
    for n in graph.node:
        ops.append(n.op_type)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops += op_types(a.g)
    return ops


def test_the_decode_graph_chooses_gathered_int8_or_sorted_matmulnbits(release):
    model, compiled = release
    E = model.config.num_experts
    graphs = {entry: onnx.load(str(compiled.out_dir / f"{entry}.onnx"), load_external_data=False).graph
              for entry in ("prefill", "decode")}
    prefill, decode = op_types(graphs["prefill"]), op_types(graphs["decode"])
    assert prefill.count("MatMulNBits") == 2 * E and "DequantizeLinear" not in prefill and "If" not in [
        n.op_type for n in graphs["prefill"].node]
    # one MoE layer: an If whose branches are the gathered form (gate/up and down dequantized)
    # and the sorted one (two MatMulNBits per expert)
    (branch,) = [n for n in graphs["decode"].node if n.op_type == "If"]
    forms = {a.name: op_types(a.g) for a in branch.attribute}
    assert forms["then_branch"].count("DequantizeLinear") == 2 and "MatMulNBits" not in forms["then_branch"]
    assert forms["else_branch"].count("MatMulNBits") == 2 * E and "DequantizeLinear" not in forms["else_branch"]
    assert not any(op.startswith("moe_experts") or op == "mxfp4_decode" for op in prefill + decode)


@pytest.mark.parametrize("batch", [1, 3])  # k3-tiny: E = 8, k = 2: 2 slots gather, 6 sort
def test_release_precision_decode_matches_eager_in_fp32(release, batch):
    model, compiled = release
    eager = fp32_copy(model)
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, 11), generator=gen)
    with torch.no_grad():
        (le, se), (lo, so) = eager.prefill(ids), compiled.prefill(ids)
        assert_close(lo, le, torch.float32, "prefill logits")
        for step in range(3):
            nxt = le[:, -1:].argmax(-1)
            (le, se), (lo, so) = eager.decode(nxt, se), compiled.decode(nxt, so)
            assert_close(lo, le, torch.float32, f"decode step {step} logits")
    for name, ref in se.items():
        if ref.is_floating_point():
            assert_close(so[name], ref, torch.float32, f"state {name}")
