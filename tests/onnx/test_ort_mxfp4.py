"""The ort flavour's MXFP4 experts: MatMulNBits on an exact 4-bit re-encoding (t = 2v = a + b,
both 4-bit, one MatMulNBits of K' = 2K on [x, x]).

Checked three ways: the artifact of a BF16 + MXFP4 k3-tiny holds MatMulNBits nodes and no
portable expert body, and computes what the reference backend computes (both in float32);
the re-encoded initializers, decoded as MatMulNBits defines it ((q - zero point) * scale,
here in numpy) and their two halves of K' added, equal the MXFP4 format's decode
(tests/mxfp4_reference.py) bit for bit (but for -0, which becomes +0); and onnxruntime's own
MatMulNBits kernel, multiplying [I, I], returns those weights exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mxfp4_reference import bits, reference_decode
from onnx import helper as oh
from onnx import numpy_helper

import k3c
from k3c.backends import artifact
from k3c.backends.onnx.ort_mxfp4 import ZERO_POINT, nbits4_pair
from k3c.compiler import CompiledModel, capture_entries, prepare
from k3c.diff import backend_for
from k3c.numerics import assert_close

PROMPT, STEPS = 12, 2


@pytest.fixture(scope="module")
def model():
    return k3c.models.build("k3-tiny", seed=5, dtype=torch.bfloat16, experts="mxfp4", num_layers=2)


@pytest.fixture(scope="module")
def compiled(model, tmp_path_factory):
    """(onnx:ort, reference computing f32), as k3c.compile builds them, from one capture."""
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    captured = capture_entries(model, (ids,))
    runs = []
    for spec in ("onnx:ort", "reference"):
        be = backend_for(spec, "f32")
        graphs = prepare(captured, be)
        out = tmp_path_factory.mktemp(spec.replace(":", "-")) / "artifact"
        artifact.write(be, graphs, out)
        runs.append(CompiledModel(be.load(out), graphs, out, be.name))
    return runs


def test_the_ort_artifact_runs_the_experts_as_matmulnbits(model, compiled):
    ort_run, _ = compiled
    experts = model.config.num_experts
    for entry in ("prefill",):  # a decode step gathers its experts (test_ort_release_route.py)
        m = onnx.load(str(ort_run.out_dir / f"{entry}.onnx"), load_external_data=False)
        ops = [n.op_type for n in m.graph.node]
        nbits = [n for n in m.graph.node if n.op_type == "MatMulNBits"]
        moe_layers = sum(1 for w in ort_run.graphs[entry].weights if w.endswith("w13_packed"))
        assert moe_layers >= 1
        assert len(nbits) == 2 * experts * moe_layers, (entry, len(nbits))  # gate/up and down per expert
        assert {(a.name, a.i) for n in nbits for a in n.attribute if a.name in ("bits", "block_size",
                                                                               "accuracy_level")} == {
            ("bits", 4), ("block_size", 32), ("accuracy_level", 0)}
        assert all(len(n.input) == 3 for n in nbits)  # the default zero point (8 for 4 bits)
        assert not any(op.startswith("moe_experts") or op == "mxfp4_decode" for op in ops), ops


def test_its_outputs_equal_the_reference_backend_in_fp32(model, compiled):
    ort_run, ref_run = compiled
    ids = torch.randint(0, model.config.vocab_size, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    (lo, so), (lr, sr) = ort_run.prefill(ids), ref_run.prefill(ids)
    assert lo.dtype == torch.float32
    assert_close(lo, lr, torch.float32, "prefill logits")
    for step in range(STEPS):
        nxt = lr[:, -1:].argmax(-1)
        (lo, so), (lr, sr) = ort_run.decode(nxt, so), ref_run.decode(nxt, sr)
        assert_close(lo, lr, torch.float32, f"decode step {step} logits")
    for name in sr:
        if sr[name].is_floating_point():
            assert_close(so[name], sr[name], torch.float32, f"state {name}")


def matmulnbits_dequant(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """MatMulNBits' definition for bits=4 and no zero-point input, in float64: B [N, K'/32, 16]
    holds per block 32 codes, the first in the low nibble; w = (q - 2^(4-1)) * scale -> [N, K']."""
    codes = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(q.shape[0], q.shape[1], 32)
    return ((codes.astype(np.float64) - 8.0) * scale.astype(np.float64)[..., None]).reshape(q.shape[0], -1)


def effective_weight(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The weight [N, K] that MatMulNBits of K' = 2K applies to [x, x]: its two halves added."""
    w = matmulnbits_dequant(q, scale)
    K = w.shape[1] // 2
    with np.errstate(over="ignore", invalid="ignore"):
        return (w[:, :K] + w[:, K:]).astype(np.float32)


def same_weights(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, except that the code for -0 (8) becomes +0: the integers a, b have no
    signed zero. Equal as numbers everywhere (NaN where the scale byte is 255)."""
    negative_zero = (want == 0) & np.signbit(want)
    keep = ~negative_zero
    return bool(np.array_equal(bits(got)[keep], bits(want)[keep]) and (got[negative_zero] == 0).all()
                and np.array_equal(got, want, equal_nan=True))


def test_every_byte_and_scale_reencodes_exactly():
    rng = np.random.default_rng(0)
    packed = np.concatenate([np.tile(np.arange(256, dtype=np.uint8), (256, 1)),
                             rng.integers(0, 256, (64, 256), dtype=np.uint8)])  # K = 512
    scale = np.concatenate([np.repeat(np.arange(256, dtype=np.uint8)[:, None], 16, 1),  # every E8M0 byte
                            rng.integers(0, 256, (64, 16), dtype=np.uint8)])
    q, s = nbits4_pair(torch.from_numpy(packed), torch.from_numpy(scale))
    assert q.dtype == torch.uint8 and s.dtype == torch.float32 and q.shape == (320, 32, 16) and s.shape == (320, 32)
    assert ZERO_POINT == 8
    want = reference_decode(packed, scale)
    got = effective_weight(q.numpy(), s.numpy())
    assert same_weights(got, want)
    assert np.isnan(want).any() and np.isinf(want).any() and (np.signbit(want) & (want == 0)).any()  # all reached


def test_the_models_reencoded_initializers_decode_to_its_mxfp4_weights(model, compiled):
    ort_run, _ = compiled
    m = onnx.load(str(ort_run.out_dir / "prefill.onnx"))  # external data loaded
    inits = {t.name: t for t in m.graph.initializer}
    weights = ort_run.graphs["prefill"].weights
    checked = 0
    for n in (n for n in m.graph.node if n.op_type == "MatMulNBits"):
        q, s = (numpy_helper.to_array(inits[i]) for i in n.input[1:3])
        packed_name, e = n.input[1].rsplit(".", 2)[:2]
        scale_name = n.input[2].rsplit(".", 2)[0]
        want = reference_decode(weights[packed_name][int(e)].numpy(), weights[scale_name][int(e)].numpy())
        assert same_weights(effective_weight(q, s), want), n.input[1]
        checked += 1
    assert checked > 0


def test_onnxruntimes_kernel_dequantizes_exactly():
    """MatMulNBits of [I, I] is W_a + W_b, transposed (two nonzero products a sum, exact)."""
    rng = np.random.default_rng(3)
    N, K = 48, 64
    packed = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
    scale = rng.integers(100, 150, (N, K // 32), dtype=np.uint8)
    scale[0, 0], scale[1, 1] = 0, 1  # the two subnormal scales
    q, s = nbits4_pair(torch.from_numpy(packed), torch.from_numpy(scale))
    concat = oh.make_node("Concat", ["A", "A"], ["AA"], axis=-1)
    node = oh.make_node("MatMulNBits", ["AA", "B", "S"], ["Y"], domain="com.microsoft", K=2 * K, N=N, bits=4,
                        block_size=32, accuracy_level=0)
    graph = oh.make_graph([concat, node], "g", [oh.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [K, K])],
                          [oh.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [K, N])],
                          [numpy_helper.from_array(q.numpy(), "B"), numpy_helper.from_array(s.numpy(), "S")])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"A": np.eye(K, dtype=np.float32)})
    assert same_weights(y.T, reference_decode(packed, scale))
