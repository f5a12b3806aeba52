"""onnxruntime's execution providers for the ONNX runner: what is asked for, checked.

    OnnxBackend(providers=["CUDAExecutionProvider"])       # k3c.compile(..., providers=[...])
    OnnxBackend(providers=[("CUDAExecutionProvider", {"device_id": 1})])

A provider is a name or onnxruntime's `(name, options)` pair. One this onnxruntime does not
have (the CPU wheel has no CUDA provider: setup.sh installs `onnxruntime-gpu` where an NVIDIA
driver is found) is a UsageError before any session opens. The CPU provider is appended when
not listed: onnxruntime places each node on the first provider in the list with a kernel for
its op and input types, and the CUDA provider lacks some (its documented kernels,
docs/OperatorKernels.md in onnxruntime), so the CPU one is the fallback for those.
onnxruntime itself falls back to the CPU, with only a logged warning, when a listed GPU
provider fails to start (no device, a driver too old): a session whose providers lack one
asked for is a UsageError too, not a silent CPU run.
"""

from __future__ import annotations

from ...errors import UsageError

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def provider_name(p: object) -> str:
    """The name of a provider given as a name or as `(name, options)`."""
    if isinstance(p, str):
        return p
    if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
        return p[0]
    raise UsageError(f"onnx providers: {p!r} is neither a provider name nor a (name, options dict) pair")


def _hint(name: str, version: str) -> str:
    if name == CUDA:
        return f"; the CUDA provider is in onnxruntime-gpu=={version}, on a machine with an NVIDIA driver and CUDA"
    return ""


def resolve(providers: list | None, available: list[str], version: str) -> list:
    """The provider list an InferenceSession gets: each asked for (this onnxruntime must have
    it), then the CPU provider if missing. None: onnxruntime's CUDA provider where it has one,
    else the CPU provider."""
    if providers is None:
        return [p for p in (CUDA, CPU) if p in available]
    if isinstance(providers, (str, tuple)) or not providers:
        raise UsageError(f"onnx providers: expected a non-empty list of provider names, got {providers!r}")
    names = [provider_name(p) for p in providers]
    for name in names:
        if name not in available:
            raise UsageError(f"onnx providers: {name} is not in this onnxruntime {version} (it has "
                             f"{', '.join(available)}){_hint(name, version)}")
    return list(providers) + ([CPU] if CPU not in names else [])


def check_session(session, providers: list, version: str) -> None:
    """The session runs on every provider asked for; onnxruntime would fall back to the CPU."""
    got = session.get_providers()
    lost = [n for n in (provider_name(p) for p in providers) if n not in got]
    if lost:
        raise UsageError(f"onnx providers: onnxruntime {version} could not start {', '.join(lost)} (no device, or "
                         f"a driver or CUDA library it needs is missing); the session would run on {', '.join(got)}")


__all__ = ["resolve", "check_session", "provider_name", "CPU", "CUDA"]
