"""onnxruntime's providers for the ONNX runner, checked without a GPU: the list handed to the
InferenceSession, a clear error when the CUDA provider is asked for and this onnxruntime
cannot give it, and a BF16 artifact whose BF16 tensors are read only by ops whose CUDA kernels
take BF16 (onnxruntime's docs/OperatorKernels.md, CUDAExecutionProvider section)."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
import torch
from cuda_kernels import CUDA_TAKES_BF16

import k3c
from k3c.backends.onnx.providers import CPU, CUDA, resolve
from k3c.backends.onnx.runner import OnnxRunner
from k3c.errors import UsageError


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).eval()
    out = tmp_path_factory.mktemp("providers") / "onnx"
    k3c.compile(module, "onnx", (torch.randn(2, 3, 8),), out)
    return out


class FakeSession:
    """Records what the runner gives onnxruntime; reports the providers a real one would run on."""

    made: list = []

    def __init__(self, path, options, providers):
        FakeSession.made.append(providers)
        self.providers = providers

    def get_providers(self):
        return [p if isinstance(p, str) else p[0] for p in self.providers if FakeSession.starts(p)]

    @staticmethod
    def starts(p) -> bool:
        return True


def test_provider_list_given_to_the_session(artifact, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    FakeSession.made.clear()
    asked = [(CUDA, {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"})]
    OnnxRunner(artifact, providers=asked).session("forward")
    assert FakeSession.made == [[asked[0], CPU]]  # the CPU provider appended as the fallback


def test_a_cuda_provider_that_does_not_start_is_an_error_not_a_cpu_run(artifact, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    monkeypatch.setattr(FakeSession, "starts", staticmethod(lambda p: p == CPU))
    with pytest.raises(UsageError, match="could not start CUDAExecutionProvider"):
        OnnxRunner(artifact, providers=[CUDA]).session("forward")
    # the default list may fall back: onnxruntime-gpu on a machine without a GPU still runs
    OnnxRunner(artifact).session("forward")


@pytest.mark.skipif(CUDA in ort.get_available_providers(), reason="this onnxruntime has the CUDA provider")
def test_cuda_asked_of_the_cpu_wheel_names_the_gpu_wheel():
    module = torch.nn.Linear(4, 4).eval()
    with pytest.raises(UsageError) as info:
        k3c.compile(module, "onnx", (torch.randn(2, 3, 4),), providers=[CUDA])
    message = str(info.value)
    assert "\n" not in message and CUDA in message and f"onnxruntime-gpu=={ort.__version__}" in message


def test_resolve_refuses_what_is_not_a_provider_list():
    for bad in ("CPUExecutionProvider", [], [("CUDAExecutionProvider",)], [3]):
        with pytest.raises(UsageError):
            resolve(bad, [CPU], ort.__version__)
    assert resolve(None, [CPU], ort.__version__) == [CPU]
    assert resolve(None, [CUDA, CPU], ort.__version__) == [CUDA, CPU]


def test_bf16_artifact_reads_its_bf16_tensors_with_kernels_the_cuda_provider_has(tmp_path):
    model = k3c.models.build("gpt2-tiny", dtype=torch.bfloat16)
    k3c.compile(model, "onnx", (torch.randint(0, model.config.vocab_size, (2, 8)),), tmp_path / "onnx")
    for entry in ("prefill", "decode"):
        proto = onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "onnx" / f"{entry}.onnx",
                                                            load_external_data=False))
        opset = next(o.version for o in proto.opset_import if o.domain == "")
        types = {v.name: v.type.tensor_type.elem_type
                 for v in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]}
        types.update({t.name: t.data_type for t in proto.graph.initializer})
        bf16 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16]
        assert bf16, f"{entry}: a BF16 model's artifact holds its weights in BF16"
        readers = {(n.domain, n.op_type) for n in proto.graph.node
                   if any(types.get(i) == onnx.TensorProto.BFLOAT16 for i in n.input)}
        for domain, op in readers:
            assert domain == "" and op in CUDA_TAKES_BF16 and opset >= CUDA_TAKES_BF16[op], \
                f"{entry}: {domain or 'ai.onnx'}::{op} reads BF16 at opset {opset}; no such CUDA kernel is listed"
