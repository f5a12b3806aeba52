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

import contextlib

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


def _patch_bf16_rounding() -> None:
    """A GPU converts float32 to bfloat16 rounding to the nearest, ties to even
    (`cvt.rn.bf16.f32`); triton's interpreter truncates (a cast passes no rounding mode), which
    biases every BF16 value it stores by up to one unit in the last place. Where a model keeps
    state in BF16 between calls that bias changes what the next call computes (a routing
    decision flips). Make the interpreter's float32 -> bfloat16 cast round as the GPU does;
    nothing is touched when triton's interpreter does not look as expected."""
    try:
        import numpy
        import triton.language as tl
        from triton.runtime import interpreter as itp

        builder, handle = itp.InterpreterBuilder, itp.TensorHandle
        cast = builder.cast_impl
    except (ImportError, AttributeError):
        return
    if getattr(cast, "_k3c", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = numpy.ascontiguousarray(src.data, dtype=numpy.float32).view(numpy.uint32)
            rounded = ((bits + numpy.uint32(0x7FFF) + ((bits >> 16) & numpy.uint32(1))) >> 16).astype(numpy.uint16)
            nan = numpy.isnan(src.data)
            rounded = numpy.where(nan, ((bits >> 16) | numpy.uint32(0x40)).astype(numpy.uint16), rounded)
            return handle(rounded.reshape(numpy.shape(src.data)), dst_type.scalar)
        return cast(self, src, dst_type)

    cast_impl._k3c = True
    builder.cast_impl = cast_impl  # create_fp_trunc calls it too


def _no_overflow_checks() -> None:
    """Triton's interpreter computes an int32 overflow check for every int32 add, sub and mul
    of every program (an int64 copy of both operands, two compares), then hands it to a device
    assert that does nothing unless the builder's options say `debug`, which they do not: a
    pure cost, 40% of an interpreted short_conv. Skip computing it, as a compiled kernel
    without debug does; with `debug` set the checks stay. Nothing is touched when triton's
    interpreter does not look as expected."""
    import dataclasses

    try:
        from triton.runtime import interpreter as itp

        builder = itp.interpreter_builder
        options = builder.options
        if options.debug or not options.sanitize_overflow:
            return
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    except (ImportError, AttributeError, TypeError):
        return


if INTERPRET:
    _patch_language_once_per_launch()
    _patch_bf16_rounding()
    _no_overflow_checks()


_GPU_TILES = {"on": False}  # gpu_tiles() in effect
_TUNED: list = []  # (autotuner, its interpreter configs, the GPU's first config) where they differ


class ByRows:
    """Interpreter tiles by the rows a launch has: of `configs` (one per `block` size), the one
    with the largest `block` that the kernel's `rows` argument needs (at least 16), so that a
    decode step's one row does not run in a 256-row tile, nor a prefill in a 16-row one."""

    def __init__(self, rows: str, block: str, configs: list[triton.Config]):
        self.rows, self.block, self.configs = rows, block, configs

    def pick(self, configs: list, named_args: dict, **kwargs) -> list:
        n = named_args[self.rows] if self.rows in named_args else kwargs[self.rows]
        cap = max(16, triton.next_power_of_2(max(int(n), 1)))
        fit = [c for c in configs if c.kwargs[self.block] <= cap]
        size = lambda c: c.kwargs[self.block]
        return [max(fit, key=size) if fit else min(configs, key=size)]


def _not_timed(*args, **kwargs) -> list[float]:
    """The autotuner's benchmark under the interpreter: nothing is run (its speed says nothing
    of a GPU), so the one config ByRows.pick leaves is taken."""
    return [0.0, 0.0, 0.0]


def autotune(configs: list[triton.Config], key: list[str], interpreted: triton.Config | ByRows | None = None,
             **kwargs):
    """`triton.autotune` on the GPU. Under the interpreter nothing is benchmarked: the config
    `interpreted` names (a tile larger than a GPU's registers hold: the interpreter runs the
    programs one after another and pays mostly per operation), or the one a ByRows
    picks for the launch's rows (the autotune key must hold their bucket), else the first
    config (put the config that runs fastest under the interpreter first: big blocks); inside
    `gpu_tiles()`, the first."""
    if not INTERPRET:
        return triton.autotune(configs=configs, key=key, **kwargs)

    def tuned(fn):
        if isinstance(interpreted, ByRows):
            own = interpreted.configs
            tuner = triton.autotune(configs=own, key=key,
                                    **{**kwargs, "prune_configs_by": {"early_config_prune": interpreted.pick}})(fn)
            tuner._bench = _not_timed
        else:
            own = [interpreted or configs[0]]
            tuner = triton.autotune(configs=own, key=key, **kwargs)(fn)
        if interpreted is not None:
            _TUNED.append((tuner, own, configs[0]))
            if _GPU_TILES["on"]:
                tuner.configs = [configs[0]]
        return tuner

    return tuned


def interpreter_tiles() -> bool:
    """Whether the kernels take their interpreter tiles (autotune's `interpreted`, the rows
    and chunk splits below): under the interpreter, outside `gpu_tiles()`."""
    return INTERPRET and not _GPU_TILES["on"]


@contextlib.contextmanager
def gpu_tiles():
    """Under the interpreter, every kernel at a tile a GPU runs it at (the first config, the
    GPU's rows per program and chunk splits) instead of its interpreter tile: what the tests
    use to run the code paths a GPU compiles, which a larger tile may skip (a chunk's
    off-diagonal blocks)."""
    _GPU_TILES["on"] = True
    for tuner, _, gpu in _TUNED:
        tuner.configs = [gpu]
    try:
        yield
    finally:
        _GPU_TILES["on"] = False
        for tuner, interp, _ in _TUNED:
            tuner.configs = list(interp)


F32_TILE = 2048  # most outputs of one program's tile when its dots take fp32 operands


def tile_fits(rows: int, cols: int, fp32_dots: bool) -> bool:
    """Whether a [rows, cols] output tile suits a GEMM-like kernel: with fp32 operands (3xTF32
    splits each in two) at most F32_TILE outputs, as larger tiles spilled on sm_90; with 16-bit
    ones the larger tiles (4096 outputs and up, or the 16-row tile of short inputs)."""
    return rows * cols <= F32_TILE if fp32_dots else rows * cols >= 2 * F32_TILE or rows == 16


def prune_rows(arg: str, block: str, cols: str | None = None):
    """An autotune pruning for a kernel over rows: keep the configs whose `block` rows are
    no more than `arg` needs (at least 16), so a decode step (one row) compiles and tries the
    small tile only; with `cols` (the config's column block) also the tiles that fit the dots'
    operand dtype (tile_fits, read from the kernel's DOT_F32). The smallest tile survives
    when none fits."""
    def prune(configs: list, named_args: dict, **kwargs) -> list:
        rows = named_args[arg] if arg in named_args else kwargs[arg]
        cap = max(16, triton.next_power_of_2(int(rows)))
        kept = [c for c in configs if c.kwargs[block] <= cap]
        if cols is not None:
            kept = [c for c in kept if tile_fits(c.kwargs[block], c.kwargs[cols], kwargs["DOT_F32"])]
        size = lambda c: c.kwargs[block] * (c.kwargs[cols] if cols else 1)
        return kept or [min(configs, key=lambda c: (c.kwargs[block], size(c)))]

    return {"early_config_prune": prune}


def rows_bucket(rows: int) -> int:
    """The autotune key of a kernel whose configs prune_rows prunes: the rows' power of two,
    capped where no config's tile is larger, so each bucket has its own best config."""
    return min(triton.next_power_of_2(max(int(rows), 1)), 256)


def rows_per_program(rows: int, width: int) -> tuple[int, int]:
    """(rows per program, num_warps) of a row kernel over `width` columns (the block's power
    of two): about 4096 fp32 values a program on a GPU (16 to 32 a thread, no spills at any
    model width), as many rows as possible under the interpreter (its cost is per operation)."""
    if interpreter_tiles():
        return min(256, triton.next_power_of_2(max(rows, 1))), 4
    br = max(1, min(triton.next_power_of_2(max(rows, 1)), 4096 // width))
    return br, 4 if width <= 2048 else 8


def dot_precision() -> str:
    """`input_precision` of a kernel's fp32 `tl.dot`s (16-bit operands go to the tensor cores as
    they are). On a GPU both choices keep the dots on the tensor cores of sm_80 and later:

    - "tf32x3" while torch's fp32 matmul precision is "highest" (its default): three TF32
      products, hi*hi + hi*lo + lo*hi of each operand split as hi + lo, whose dropped lo*lo
      term is ~2^-22 relative, near fp32's own 2^-24 (CUTLASS's 3xTF32 finding). The exact FMA
      dot ("ieee") would leave the tensor cores idle; the chunked delta rule's pieces, the
      largest fp32 dots here, are memory-bound even at a third of TF32's rate (roofline.py);
    - "tf32" when torch allows TF32 ("high", "medium");
    - "ieee" under the interpreter, whose dots are exact fp32 whatever is asked.
    """
    if INTERPRET:
        return "ieee"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


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
        if t is None or t.is_meta:  # meta: the AOT compiler runs the templates for shapes only
            continue
        on_cuda = t.device.type == "cuda"
        if INTERPRET and on_cuda:
            raise ValueError(f"{what}: Triton runs under TRITON_INTERPRET=1 here and needs CPU tensors, "
                             f"got one on {t.device}")
        if not INTERPRET and not on_cuda:
            raise ValueError(f"{what}: Triton kernels are compiled for the GPU here and need CUDA tensors, "
                             f"got one on {t.device} (or set TRITON_INTERPRET=1 before importing k3c's kernels)")


__all__ = ["INTERPRET", "DEVICE", "autotune", "interpreter_tiles", "gpu_tiles", "tile_fits", "prune_rows",
           "rows_bucket", "rows_per_program", "dot_precision", "dots_in_fp32", "block", "check_device"]
