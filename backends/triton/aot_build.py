"""Compile one recorded kernel for a GPU target and read what the hardware would see.

No GPU and no CUDA driver are needed: `triton.compile` lowers the kernel to TTIR, TTGIR,
LLVM IR and PTX, and the ptxas shipped in the triton wheel assembles the cubin. What a row
of kernels.json holds is read from those artifacts, not estimated:

    registers, stack, local    `cuobjdump -res-usage` on the cubin (REG, STACK, LOCAL)
    spill_bytes                ptxas's own report (`N bytes spill stores, M bytes spill loads`)
    shared_bytes               the dynamic shared memory triton asks for at launch plus the
                               cubin's static SHARED
    tensor_cores               the tensor-core instructions in the PTX: `wgmma.mma_async`
                               (sm_90), `mma.sync` (sm_80 and up), `tcgen05.mma` (sm_100), and
                               "tcgen05.block_scale" when every tcgen05.mma is the block-scaled
                               one (MX operands, E8M0 scales applied by the MMA); their count in
                               the SASS (HGMMA / HMMA / UTC*MMA) for one variant with dots of each
                               kernel function (count_sass_tensor_ops)
    mma                        the distinct tensor-core instructions of the PTX, in full
                               (`tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale...`)
    dots, dot_kinds            the `tt.dot` / `tt.dot_scaled` ops of the TTIR, i.e. what the
                               kernel asks for, and what they multiply: "bf16"/"f16" operands,
                               fp32 ones as "tf32", "tf32x3" (three TF32 products) or "ieee" (FMA,
                               no tensor cores), a scaled dot as its formats ("e2m1 x e4m3")
"""

from __future__ import annotations

import contextlib
import io
import re
import resource
import subprocess
import time
from pathlib import Path

from .aot import Target
from .aot_record import Launch

import triton  # isort: skip

# PTX instruction -> the tensor-core family it belongs to, newest first
TENSOR_CORE_PTX = (("tcgen05.mma", "tcgen05"), ("wgmma.mma_async", "wgmma"), ("mma.sync", "mma"))
MMA_PTX = re.compile(r"\b(?:tcgen05\.mma|wgmma\.mma_async|mma\.sync)(?:\.[\w:]+)*")
SASS_TENSOR_OPS = re.compile(r"\b(?:HGMMA|HMMA|IMMA|UTC\w*MMA)\b")
TTIR_DOT = re.compile(r"\btt\.dot(?:_scaled)? [^:]*?(?:inputPrecision = (?P<prec>\w+))?"
                      r"(?:lhs = (?P<lhs>\w+) rhs = (?P<rhs>\w+)[^:]*?)?\s*:\s*tensor<[0-9x]+x(?P<elem>\w+)>")
RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def tool(name: str) -> Path:
    """A CUDA tool shipped in the triton wheel (cuobjdump, nvdisasm, ptxas)."""
    return Path(triton.__file__).resolve().parent / "backends" / "nvidia" / "bin" / name


def build(launch: Launch, target: Target, cubin_dir: Path) -> dict:
    """Compile `launch` for `target`, write its cubin into `cubin_dir`, return its kernels.json row.
    A kernel the compiler rejects gives a row with ok=False and the compiler's message."""
    from triton import knobs

    row = {"name": launch.name, "constexprs": launch.named_constexprs(),
           "num_warps": launch.options.num_warps, "num_stages": launch.options.num_stages,
           "signature": {k: v for k, v in launch.signature.items() if v != "constexpr"},
           "launched_by": launch.callers, "cases": launch.cases, "launches": launch.launches, "grid": launch.grid,
           "target": target.name}
    log = io.StringIO()
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    try:
        with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers and spills, printed by triton
            knobs.compilation.always_compile = True  # past triton's cache, so ptxas runs and reports
            kernel = triton.compile(launch.source(), target=target.gpu_target(), options=launch.options.__dict__)
    except Exception as e:  # the compiler's own error, whatever its type: it is the message we report
        row.update(ok=False, error=compiler_message(e), seconds=round(time.perf_counter() - t0, 3),
                   cpu_seconds=round(_cpu_seconds() - cpu0, 3))
        return row
    cubin = cubin_dir / f"{launch.name}-{kernel.hash[:12]}.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    row.update(ok=True, cubin=f"{cubin_dir.name}/{cubin.name}", hash=kernel.hash)
    row.update(_resources(cubin, kernel, log.getvalue()))
    row.update(_tensor_cores(kernel.asm["ttir"], kernel.asm["ptx"], cubin, target))
    row.update(seconds=round(time.perf_counter() - t0, 3), cpu_seconds=round(_cpu_seconds() - cpu0, 3))
    return row


def _cpu_seconds() -> float:
    """CPU time of this process and the tools it ran (ptxas): on a shared machine the wall
    time of a compile says how busy the machine was, this says what the compile cost."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _resources(cubin: Path, kernel, ptxas_log: str) -> dict:
    usage = _run(tool("cuobjdump"), "-res-usage", str(cubin))
    m = RES_USAGE.search(usage)
    if not m:
        raise RuntimeError(f"cuobjdump -res-usage printed no resource line for {cubin.name}: {usage[:200]!r}")
    regs, stack, static_shared, local = (int(x) for x in m.groups())
    spills = SPILLS.search(ptxas_log)
    if not spills:
        raise RuntimeError(f"ptxas printed no spill line for {cubin.name}: {ptxas_log[:200]!r}")
    dynamic = int(kernel.metadata.shared)
    return {"registers": regs, "spill_bytes": int(spills.group(1)) + int(spills.group(2)), "stack_bytes": stack,
            "local_bytes": local, "shared_bytes": dynamic + static_shared, "shared_dynamic": dynamic,
            "shared_static": static_shared}


def _tensor_cores(ttir: str, ptx: str, cubin: Path, target: Target) -> dict:
    kinds = [_dot_kind(m) for m in TTIR_DOT.finditer(ttir)]
    family = next((fam for instr, fam in TENSOR_CORE_PTX if instr in ptx), None)
    mma = sorted(set(MMA_PTX.findall(ptx)))
    tcgen05 = [m for m in mma if m.startswith("tcgen05.mma")]
    if family == "tcgen05" and tcgen05 and all("block_scale" in m for m in tcgen05):
        family = "tcgen05.block_scale"
    return {"dots": len(kinds), "dot_kinds": sorted(set(kinds)), "tensor_cores": family, "mma": mma,
            "tensor_core_sass": None}


def count_sass_tensor_ops(rows: list[dict], out_dir: Path) -> None:
    """The SASS cross-check of the PTX: for one compiled variant with dots of each kernel
    function, the tensor-core instructions in its disassembly (`tensor_core_sass`; None where
    not disassembled: that costs 0.7 s of CPU a cubin, more than compiling most kernels)."""
    done: set[str] = set()
    for row in rows:
        if row.get("ok") and row.get("dots") and row["name"] not in done:
            done.add(row["name"])
            sass = _run(tool("cuobjdump"), "-sass", str(out_dir / row["cubin"]))
            row["tensor_core_sass"] = len(SASS_TENSOR_OPS.findall(sass))


def _dot_kind(m: re.Match) -> str:
    """What a tt.dot multiplies: its operands' type when 16- or 8-bit ("bf16", "f16"), else the
    precision of its fp32 operands ("tf32", "tf32x3", "ieee": an FMA dot, the default); a scaled
    dot's operand formats ("e2m1 x e4m3")."""
    if m.group("lhs"):
        return f"{m.group('lhs')} x {m.group('rhs')}"
    elem = m.group("elem")
    return elem if elem != "f32" else (m.group("prec") or "ieee").lower()


def _run(exe: Path, *args: str) -> str:
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RuntimeError(f"{exe.name} {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[:300]}")
    return r.stdout


def compiler_message(e: Exception) -> str:
    """The compiler's message, what it says first: a CompilationError prints the kernel's source
    around the spot and ends with the error, so that becomes `Error(...) (at L:C of the kernel)`;
    a ptxas failure keeps its first lines (the command's exit, then ptxas's own log)."""
    text = str(e).strip()
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].startswith("at ") and "^" in (ln.strip() for ln in lines):
        last_caret = max(i for i, ln in enumerate(lines) if ln.strip() == "^")
        return f"{' '.join(lines[last_caret + 1:]) or type(e).__name__} ({lines[0].rstrip(':')} of the kernel)"
    head = f"{type(e).__name__}: " + "\n".join(lines[:12])
    return head + ("\n..." if len(lines) > 12 else "")


__all__ = ["build", "tool", "compiler_message", "count_sass_tensor_ops"]
