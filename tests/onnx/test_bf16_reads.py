"""BF16 weights read as stored by onnxruntime (passes/bf16_reads.py). On the CPU provider the
embedding table is gathered as stored, with no float32 copy, and the artifact computes what it
did. The artifact built for onnxruntime's CUDA provider under compute="bf16", checked
without a GPU: its BF16 tensors are read only by ops whose CUDA kernels take BF16
(onnxruntime's docs/OperatorKernels.md, CUDAExecutionProvider section), its GEMMs read the
stored BF16 weights with no float32 copy, a CPU session refuses it by name, and what it
computes, with each BF16 MatMul computed on the CPU as the CUDA kernel computes it, is the
eager policy in its BF16-product form (models.precision.bf16_policy, bf16_outputs=True) at
the BF16_COMPUTE row on the artifact's own routing (k3c diff)."""

from __future__ import annotations

import json

import onnx
import onnxruntime as ort
import pytest
import torch
from cuda_kernels import CUDA_TAKES_BF16
from onnx import TensorProto, helper

import k3c
from k3c import backends, models
from k3c.backends.artifact import MANIFEST, seal
from k3c.backends.onnx import OnnxBackend
from k3c.backends.onnx.providers import CPU, CUDA
from k3c.backends.onnx.runner import OnnxRunner
from k3c.compiler import capture_entries, prepare
from k3c.diff import diff
from k3c.errors import UsageError
from k3c.models.precision import bf16_policy, fp32_copy, with_bf16_outputs
from k3c.numerics import BF16_COMPUTE, compare, model_tolerance
from k3c.yardstick import float64_copy, float64_mode

SMALL = dict(experts="mxfp4", num_layers=4, mla_layers=(4,))  # KDA, MoE with MXFP4 experts, MLA


def _types(proto: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(proto).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = models.build("k3-tiny", seed=3, dtype=torch.bfloat16, **SMALL)
    graphs = capture_entries(model, (torch.randint(0, model.config.vocab_size, (2, 8)),))
    be = OnnxBackend(target="cuda")
    prepared = prepare(graphs, be, compute="bf16")
    out = be.lower(prepared, tmp_path_factory.mktemp("cuda") / "onnx")  # lowering needs no GPU
    return prepared, out


def test_bf16_is_read_only_by_kernels_the_cuda_provider_has(built):
    prepared, out = built
    assert OnnxBackend(providers=[CUDA]).gemm_io == "bf16" and OnnxBackend(providers=[CPU, CUDA]).gemm_io is None
    assert OnnxBackend().gemm_io is None
    assert json.loads((out / MANIFEST).read_text())["provider"] == CUDA
    for entry, g in prepared.items():
        assert "bf16-reads" in g.meta["pipeline"]
        proto = onnx.load(out / f"{entry}.onnx", load_external_data=False)
        opset = next(o.version for o in proto.opset_import if o.domain == "")
        types = _types(proto)
        bf16 = [n for n in proto.graph.node if any(types.get(i) == TensorProto.BFLOAT16 for i in n.input)]
        for n in bf16:
            assert n.domain == "" and opset >= CUDA_TAKES_BF16.get(n.op_type, 10**9), \
                f"{entry}: {n.domain or 'ai.onnx'}::{n.op_type} reads BF16 at opset {opset}; no such CUDA kernel"
        # one BF16 MatMul per plain GEMM of the graph that multiplies BF16, each on a stored weight
        gemms = [n for n in g.nodes if n.op in ("linear", "matmul") and g.types[n.outputs[0]].dtype == "bf16"]
        matmuls = [n for n in bf16 if n.op_type == "MatMul"]
        assert len(gemms) >= 10 and len(matmuls) == len(gemms), entry
        stored = {t.name for t in proto.graph.initializer if t.data_type == TensorProto.BFLOAT16}
        read = {n.input[1] for n in matmuls}
        assert read <= stored, f"{entry}: MatMuls read {sorted(read - stored)} not as stored BF16 weights"
        table = [n.input[0] for n in bf16 if n.op_type == "Gather"]
        assert len(table) == 1 and table[0] in stored, f"{entry}: the embedding table is gathered as stored"
        widened = {i for n in proto.graph.node if n.op_type == "Cast" for i in n.input} & (read | set(table))
        assert not widened, f"{entry}: float32 copies of {sorted(widened)}"


def test_the_cpu_form_gathers_the_embedding_as_stored(tmp_path):
    model = models.build("k3-tiny", seed=3, dtype=torch.bfloat16, **SMALL)
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    compiled = k3c.compile(model, "onnx", (ids,), out_dir=tmp_path / "onnx")
    proto = onnx.load(tmp_path / "onnx" / "prefill.onnx", load_external_data=False)
    table = "model.embed_tokens.weight"
    stored = {t.name: t.data_type for t in proto.graph.initializer}
    assert stored[table] == TensorProto.BFLOAT16
    readers = [n.op_type for n in proto.graph.node if table in n.input]
    assert readers == ["Gather"], readers  # no Cast: no float32 copy of the table at load
    with torch.no_grad():
        want = fp32_copy(model).prefill(ids)[0]
        with float64_mode():
            exact = float64_copy(fp32_copy(model)).prefill(ids)[0]
    got = compiled.runner.run("prefill", ids)[0]
    assert compare(got, want, tolerance=model_tolerance(want, exact)).ok


@pytest.mark.skipif(CUDA in ort.get_available_providers(), reason="this onnxruntime has the CUDA provider")
def test_it_loads_anywhere_and_runs_only_on_the_cuda_provider(built):
    _, out = built
    runner = OnnxRunner(out)  # loads where it was built, as TVM's cuda artifacts do
    with pytest.raises(UsageError) as info:
        runner.run("prefill", torch.zeros(1, 4, dtype=torch.long))
    assert CUDA in str(info.value) and f"onnxruntime-gpu=={ort.__version__}" in str(info.value)
    with pytest.raises(UsageError) as info:
        OnnxRunner(out, providers=[CPU])
    assert CUDA in str(info.value) and "BF16 MatMul" in str(info.value) and CPU in str(info.value)


def cuda_matmul_on_cpu(path) -> int:
    """Each MatMul over BF16 in `path` as onnxruntime's CUDA kernel computes it (cuBLAS with a
    float32 compute type): BF16 operands widened exactly, products summed in float32, the sum
    rounded to BF16 once. The CPU provider has no BF16 MatMul, so the widening is spelled out."""
    proto = onnx.load(path, load_external_data=False)
    types, nodes, n_rewritten = _types(proto), [], 0
    for n in proto.graph.node:
        if n.op_type != "MatMul" or types.get(n.input[0]) != TensorProto.BFLOAT16:
            nodes.append(n)
            continue
        a, b, y = (f"{n.output[0]}.emulated.{k}" for k in "aby")
        nodes += [helper.make_node("Cast", [n.input[0]], [a], to=TensorProto.FLOAT),
                  helper.make_node("Cast", [n.input[1]], [b], to=TensorProto.FLOAT),
                  helper.make_node("MatMul", [a, b], [y]),
                  helper.make_node("Cast", [y], [n.output[0]], to=TensorProto.BFLOAT16)]
        n_rewritten += 1
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    onnx.save(proto, path)
    return n_rewritten


class CudaMatMulOnCpu(OnnxBackend):
    """The artifact for the CUDA provider, its BF16 MatMuls computed on the CPU as above."""

    gemm_io = "bf16"

    def lower(self, graphs, out_dir, **kw):
        out = super().lower(graphs, out_dir, **kw)
        manifest = json.loads((out / MANIFEST).read_text())
        assert manifest["provider"] == CUDA
        assert sum(cuda_matmul_on_cpu(out / spec["file"]) for spec in manifest["entries"].values()) > 0
        manifest["provider"] = None
        (out / MANIFEST).write_text(json.dumps(manifest))
        seal(out, backend="onnx", model=manifest["model"], variant=self.flavour)
        return out


@pytest.mark.parametrize("name,kw", [("kimi-linear-tiny", {}), ("k3-tiny", {"experts": "mxfp4"})])
def test_it_computes_the_policy_with_bf16_products(name, kw, monkeypatch):
    """Whole models beside the CPU form, in one run (`pytest -s` prints each backend's worst
    tensor as a share of the row, and its routing)."""
    monkeypatch.setitem(backends._EXTRA, "onnx-cuda-on-cpu", CudaMatMulOnCpu)
    model = models.build(name, dtype=torch.bfloat16, **kw)
    report = diff(model, ["onnx-cuda-on-cpu", "onnx"], seq_len=40, batch=2, decode_steps=4, timing=False,
                  bisect=False, compute="bf16", greedy_tokens=2)
    for spec, b in report.backends.items():
        assert b.error is None and b.ok, report.table(per_tensor=True)
        assert all((t.tol_rel_rms, t.tol_max_abs) == (BF16_COMPUTE.rel_rms, BF16_COMPUTE.max_abs) for t in b.tensors)
        assert b.routing["slots"] > 0
        worst = max(max(t.rel_rms_err / t.tol_rel_rms, t.max_abs_err / t.tol_max_abs) for t in b.tensors)
        print(f"{name} {spec}: worst tensor {worst:.2f} of the row, routing {b.routing['agreeing']}/"
              f"{b.routing['slots']} slots agree")


class TwoGemms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(96, 64, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def test_each_gemm_returns_its_product_in_bf16(tmp_path, monkeypatch):
    """One GEMM at a time, no routing: the artifact's products are BF16 values, those of the
    eager form but where the two float32 sums straddle a rounding boundary (an ulp apart),
    while the plain policy keeps float32 products, which the whole-model row cannot tell."""
    monkeypatch.setitem(backends._EXTRA, "onnx-cuda-on-cpu", CudaMatMulOnCpu)
    torch.manual_seed(0)
    m = TwoGemms().to(torch.bfloat16)
    x = torch.randn(2, 5, 64).to(torch.bfloat16)
    got = k3c.compile(m, "onnx-cuda-on-cpu", (x,), out_dir=tmp_path / "a", compute="bf16", dynamic=False)(x.float())
    policy = bf16_policy(m)
    with torch.no_grad():
        want, plain = with_bf16_outputs(policy)(x.float()), policy(x.float())
    assert torch.equal(got, got.bfloat16().float())  # every output a BF16 value
    assert not torch.equal(plain, plain.bfloat16().float())
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(2.0**-100))) - 7)
    assert ((got - want).abs() <= ulp).all()
    assert (got == want).float().mean() >= 0.99
