"""What every Triton template of k3c shares: the execution mode, the device its tensors live
on, the autotune wrapper and the precision of fp32 dots.

Import this module before `triton` (every template does); the mode is decided once per
process (../triton_mode.py, also called at `import k3c`), before any `@triton.jit` runs:

- `TRITON_INTERPRET=1` in the environment: the interpreter (numpy on the CPU);
- `TRITON_INTERPRET` unset and no CUDA device: the interpreter as well (the variable is set
  for the process, so the same kernel source runs everywhere);
- otherwise compiled for the GPU; tensors must then be CUDA tensors.

Under the interpreter `tl.dot` is exact fp32, bf16 dots are wrong (templates cast to fp32
first), programs run one after another (races cannot show) and it is slow: keep shapes small.
"""

from __future__ import annotations

import torch

from ..triton_mode import choose

INTERPRET: bool = choose()  # before triton is imported: see ../triton_mode.py

import triton  # noqa: E402  (after the mode is decided)

DEVICE: str = "cpu" if INTERPRET else "cuda"


def _patch_language_once_per_launch() -> None:
    """Interpreter speed: triton re-patches `triton.language` (an `inspect.getmembers` scan,
    ~10 ms) on every call of a device function such as `tl.sum` or `tl.cumsum`, although the
    launch that runs it has patched the same modules already. Patch once per module set and
    launch instead; the launch still restores everything when it ends. Only speed changes
    (and numpy's floating-point warnings go quiet), and nothing is touched when triton's
    interpreter does not look as expected."""
    try:
        import numpy
        from triton.runtime import interpreter as itp

        grid_call, device_call = itp.GridExecutor.__call__, itp.InterpretedFunction.__call__
        patch_lang, error = itp._patch_lang, itp.InterpreterError
    except (ImportError, AttributeError):
        return
    if getattr(device_call, "_k3c", False):
        return
    launch = {"depth": 0, "patched": set()}

    def grid_call_once(self, *args, **kwargs):
        if launch["depth"] == 0:
            launch["patched"] = set()
        launch["depth"] += 1
        try:
            # IEEE results as on a GPU, without numpy's warnings: exp overflowing to inf is meant
            # (sigmoid(x) = 1 / (1 + exp(-x)) -> 0), and masked-off lanes may hold 0 / 0
            with numpy.errstate(all="ignore"):
                return grid_call(self, *args, **kwargs)
        finally:
            launch["depth"] -= 1

    def device_call_once(self, *args, **kwargs):
        key = id(self.fn.__globals__)
        if launch["depth"] == 0 or key not in launch["patched"]:
            patch_lang(self.fn)
            if launch["depth"]:
                launch["patched"].add(key)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    device_call_once._k3c = True
    itp.GridExecutor.__call__ = grid_call_once
    itp.InterpretedFunction.__call__ = device_call_once


if INTERPRET:
    _patch_language_once_per_launch()


def autotune(configs: list[triton.Config], key: list[str], **kwargs):
    """`triton.autotune` on the GPU; under the interpreter only the first config, so nothing
    is benchmarked (put the config that runs fastest under the interpreter first: big blocks)."""
    return triton.autotune(configs=configs[:1] if INTERPRET else configs, key=key, **kwargs)


def dot_precision() -> str:
    """`input_precision` of fp32 `tl.dot`s: 'ieee' while torch is asked for exact fp32 matmuls
    (`torch.get_float32_matmul_precision() == "highest"`, the default), else 'tf32'."""
    return "ieee" if INTERPRET or torch.get_float32_matmul_precision() == "highest" else "tf32"


def dots_in_fp32(*tensors: torch.Tensor) -> bool:
    """Whether dot operands are upcast to fp32 first: always under the interpreter (its bf16
    dot is wrong) and for fp32 inputs; 16-bit inputs on the GPU go to the tensor cores as is."""
    return INTERPRET or any(t.dtype == torch.float32 for t in tensors)


def block(n: int, lo: int = 16) -> int:
    """The power-of-two block that covers a dim of size n (at least `lo`, as tl.dot needs 16)."""
    return max(lo, triton.next_power_of_2(int(n)))


def check_device(what: str, *tensors: torch.Tensor) -> None:
    """A clear error when tensors are on the wrong device for the current mode."""
    for t in tensors:
        if t is None:
            continue
        on_cuda = t.device.type == "cuda"
        if INTERPRET and on_cuda:
            raise ValueError(f"{what}: Triton runs under TRITON_INTERPRET=1 here and needs CPU tensors, "
                             f"got one on {t.device}")
        if not INTERPRET and not on_cuda:
            raise ValueError(f"{what}: Triton kernels are compiled for the GPU here and need CUDA tensors, "
                             f"got one on {t.device} (or set TRITON_INTERPRET=1 before importing k3c's kernels)")


__all__ = ["INTERPRET", "DEVICE", "autotune", "dot_precision", "dots_in_fp32", "block", "check_device"]
