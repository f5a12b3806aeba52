"""Ahead-of-time compilation of a Triton artifact for a real GPU, on a machine without one.

    report = compile_kernels("k3-tiny-triton", "sm_90")      # after TritonBackend().lower(...)
    report.summary()       # count, worst registers, spills, shared bytes, tensor-core dots
    report.problems()      # one line per kernel that failed, spills, or misses the tensor cores

`k3c compile --model NAME --backend triton --target sm_90` (or `k3c.compile(..., target="sm_90")`)
does the same after writing the module. Every kernel the generated module would launch is
compiled, found by running the module's entries on meta tensors with the launches
intercepted (aot_record.py): the prefill entry at T = seq_len and the decode entry (T = 1)
after a prefill of seq_len tokens, batch 1 unless asked. Each distinct kernel (function,
argument dtypes and specialisation, constexprs, autotune config) is compiled once with
triton's compiler and the ptxas of the triton wheel (aot_build.py); no GPU, no CUDA driver.

Written beside the module:
    DIR/kernels.json       one row per kernel: name, constexprs, num_warps, num_stages, registers,
                           spill_bytes, shared_bytes, tensor_cores, dots, ... (aot_build.py)
    DIR/<target>/*.cubin   the cubins

The work runs in a subprocess (aot_worker.py) with TRITON_INTERPRET=0: this process may
have chosen triton's interpreter at import (kernels/common/triton_mode.py), and that choice
cannot be undone in a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

KERNELS_JSON = "kernels.json"
DEFAULT_SEQ_LEN = 8192  # fla's chunk_kda anchors are at T = 8192; any length works on meta tensors


@dataclass(frozen=True)
class Target:
    """A GPU target k3c compiles for, with the limits its kernels must fit."""

    name: str  # "sm_90"
    arch: int  # 90
    shared_limit: int  # the most shared memory one block may ask for (opt-in), bytes
    tensor_cores: tuple[str, ...]  # the PTX tensor-core families found on this target
    block_scaled: bool = False  # MX operands with their E8M0 scales multiply in the MMA itself

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, 32)


# Shared memory per block (opt-in maximum) from NVIDIA's CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability": 163 KB on 8.0, 227 KB on 9.0 and 10.0.
TARGETS: dict[str, Target] = {
    "sm_80": Target("sm_80", 80, 163 * 1024, ("mma",)),
    "sm_90": Target("sm_90", 90, 227 * 1024, ("wgmma", "mma")),
    "sm_100": Target("sm_100", 100, 227 * 1024, ("tcgen05.block_scale", "tcgen05", "wgmma", "mma"), True),
}


def target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"triton: unknown GPU target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[name]


# CUDA's launch limits: blocks in a grid's x, and in its y and z
GRID_X, GRID_YZ = 2**31 - 1, 65535


def check_launch_limits(seq_len: object, what: str = "seq_len") -> None:
    """The prefill length an AOT compile is for must give grids a GPU can launch: the chunked
    kernels put T / chunk in a grid's y (chunk_output's grid is (V / BV, T / C, B H)), which
    CUDA caps at 65535 blocks. One check for `k3c.compile(target=...)` and the CLI's --seq-len."""
    from ...errors import UsageError
    from ...kernels.delta.chunk import DEFAULT_CHUNK_SIZE

    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise UsageError(f"{what} {seq_len!r}: the prefill length of an AOT compile must be an int >= 1")
    chunks = -(-seq_len // DEFAULT_CHUNK_SIZE)
    if chunks > GRID_YZ:
        raise UsageError(f"{what} {seq_len}: {chunks} chunks of {DEFAULT_CHUNK_SIZE} tokens in a grid's y exceed "
                         f"CUDA's launch limit of {GRID_YZ} blocks (at most {GRID_YZ * DEFAULT_CHUNK_SIZE} tokens)")


def grid_fits(grid: list[int]) -> bool:
    """Whether a launch grid [x, y, z] is within CUDA's limits."""
    x, y, z = (list(grid) + [1, 1])[:3]
    return 0 < x <= GRID_X and 0 < y <= GRID_YZ and 0 < z <= GRID_YZ


class AotError(RuntimeError):
    """Kernels that do not compile (or could not launch): one line each, kernels.json written."""


@dataclass
class AotReport:
    """The rows of DIR/kernels.json and what they say against the target's limits."""

    target: Target
    kernels: list[dict]
    path: Path
    seconds: float = 0.0  # wall time of the AOT run (record + compile), 0 when read from disk
    cases: list[str] = field(default_factory=list)

    @property
    def compiled(self) -> list[dict]:
        return [k for k in self.kernels if k["ok"]]

    def failed(self) -> list[dict]:
        return [k for k in self.kernels if not k["ok"]]

    def over_shared(self) -> list[dict]:
        return [k for k in self.compiled if k["shared_bytes"] > self.target.shared_limit]

    def spilled(self) -> list[dict]:
        return [k for k in self.compiled if k["spill_bytes"] or k["local_bytes"]]

    def dots_off_tensor_cores(self) -> list[dict]:
        """Kernels with a tt.dot whose PTX has no tensor-core instruction of this target."""
        return [k for k in self.compiled if k["dots"] and k["tensor_cores"] not in self.target.tensor_cores]

    def over_grid(self) -> list[dict]:
        """Kernels launched with a grid past CUDA's limits (x < 2^31, y and z <= 65535 blocks)."""
        return [k for k in self.kernels if k.get("grid") and not grid_fits(k["grid"])]

    def errors(self) -> list[str]:
        """What stops a kernel from running: compile failures, shared memory over the limit,
        grids past the launch limits."""
        out = [f"{k['name']} {_fmt(k['constexprs'])}: does not compile for {self.target.name}: "
               f"{k['error'].splitlines()[0]}" for k in self.failed()]
        out += [f"{k['name']} {_fmt(k['constexprs'])}: {k['shared_bytes']} bytes of shared memory, over "
                f"{self.target.name}'s {self.target.shared_limit}" for k in self.over_shared()]
        out += [f"{k['name']} {_fmt(k['constexprs'])}: grid {tuple(k['grid'])} is past CUDA's launch limits "
                f"({GRID_X}, {GRID_YZ}, {GRID_YZ})" for k in self.over_grid()]
        return out

    def problems(self) -> list[str]:
        """errors() plus what makes a kernel slow: spills, dots that miss the tensor cores."""
        out = self.errors()
        out += [f"{k['name']} {_fmt(k['constexprs'])}: spills {k['spill_bytes']} bytes "
                f"({k['registers']} registers)" for k in self.spilled()]
        out += [f"{k['name']} {_fmt(k['constexprs'])}: {k['dots']} dot(s), no tensor-core instruction"
                for k in self.dots_off_tensor_cores()]
        return out

    def summary(self) -> dict:
        ok = self.compiled
        worst = max(ok, key=lambda k: k["registers"], default=None)
        most_shared = max(ok, key=lambda k: k["shared_bytes"], default=None)
        tc = sorted({k["name"] for k in ok if k["tensor_cores"]})
        return {
            "target": self.target.name, "kernels": len(self.kernels), "compiled": len(ok),
            "distinct_functions": len({k["name"] for k in self.kernels}),
            "failed": len(self.failed()),
            "worst_registers": worst and {"name": worst["name"], "registers": worst["registers"]},
            "spills": len(self.spilled()), "spill_bytes": sum(k["spill_bytes"] for k in ok),
            "max_shared_bytes": most_shared and {"name": most_shared["name"], "bytes": most_shared["shared_bytes"],
                                                 "limit": self.target.shared_limit},
            "tensor_core_kernels": tc,
            "tensor_core_families": sorted({k["tensor_cores"] for k in ok if k["tensor_cores"]}),
            "dot_kernels_off_tensor_cores": sorted({k["name"] for k in self.dots_off_tensor_cores()}),
            # compiled in this run (the rest came from the row cache)
            "compiled_now": sum(1 for k in self.kernels if not k.get("cached")),
            "compile_seconds": round(sum(k.get("seconds", 0.0) for k in self.kernels if not k.get("cached")), 1),
            "compile_cpu_seconds": round(sum(k.get("cpu_seconds", 0.0) for k in self.kernels if not k.get("cached")),
                                         1),
            "wall_seconds": round(self.seconds, 1), "cases": self.cases,
        }

    def table(self) -> str:
        """One line per kernel function: variants, registers, spills, shared bytes, tensor cores."""
        by_name: dict[str, list[dict]] = {}
        for k in self.kernels:
            by_name.setdefault(k["name"], []).append(k)
        rows = [("kernel", "variants", "failed", "max regs", "spill B", "max shared B", "dots", "tensor cores")]
        for name in sorted(by_name):
            ks = by_name[name]
            ok = [k for k in ks if k["ok"]]
            fams = sorted({k["tensor_cores"] for k in ok if k["tensor_cores"]})
            rows.append((name, str(len(ks)), str(len(ks) - len(ok)), str(max((k["registers"] for k in ok), default=0)),
                         str(max((k["spill_bytes"] for k in ok), default=0)),
                         str(max((k["shared_bytes"] for k in ok), default=0)),
                         str(max((k["dots"] for k in ok), default=0)), ",".join(fams) or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        s = self.summary()
        shared = s["max_shared_bytes"]["bytes"] if s["max_shared_bytes"] else 0
        lines.append(f"{s['kernels']} kernels ({s['distinct_functions']} functions) for {self.target.name}: "
                     f"{s['failed']} failed, {s['spills']} spill, max shared {shared} of {self.target.shared_limit} B; "
                     f"{s['compiled_now']} compiled now in {s['compile_cpu_seconds']} s of CPU")
        return "\n".join(lines)


def _fmt(constexprs: dict) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in constexprs.items()) + "}"


def compile_kernels(out_dir: str | Path, target_name: str = "sm_90", *, seq_len: int = DEFAULT_SEQ_LEN,
                    batch: int = 1, jobs: int | None = None, precision: str | None = None,
                    timeout: float | None = None) -> AotReport:
    """Compile every kernel of the Triton artifact in `out_dir` for `target_name` ("sm_80",
    "sm_90", "sm_100"); writes DIR/kernels.json and DIR/<target>/*.cubin. `precision` is the
    fp32 matmul precision the module runs under (torch's; default: this process's). Raises
    AotError naming each kernel that does not compile or would not launch."""
    tgt = target(target_name)
    out = Path(out_dir)
    if not (out / "manifest.json").exists():
        raise FileNotFoundError(f"{out} holds no Triton artifact (no manifest.json)")
    if seq_len < 1 or batch < 1:
        raise ValueError(f"triton AOT: seq_len and batch must be >= 1, got {seq_len} and {batch}")
    import torch

    precision = precision or torch.get_float32_matmul_precision()
    jobs = jobs or len(os.sched_getaffinity(0))
    cmd = [sys.executable, "-m", "k3c.backends.triton.aot_worker", str(out), "--target", tgt.name,
           "--seq-len", str(seq_len), "--batch", str(batch), "--jobs", str(jobs), "--precision", precision]
    env = dict(os.environ, TRITON_INTERPRET="0")  # compiled-mode kernels (JITFunctions) in the worker
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    if r.returncode:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        said = next((ln for ln in reversed(lines) if ln.startswith("aot_worker:")), lines[-1] if lines else "")
        raise AotError(f"triton AOT for {tgt.name} failed: {said or f'exit {r.returncode}'}")
    report = load_report(out, seconds)
    errors = report.errors()
    if errors:
        raise AotError(f"{len(errors)} of {len(report.kernels)} kernels cannot run on {tgt.name} (see "
                       f"{out / KERNELS_JSON}):\n" + "\n".join(errors))
    return report


def load_report(out_dir: str | Path, seconds: float = 0.0) -> AotReport:
    """The AotReport of the kernels.json in `out_dir`."""
    path = Path(out_dir) / KERNELS_JSON
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; compile with --target sm_90 (or sm_80, sm_100) first")
    rows = json.loads(path.read_text())
    names = {r["target"] for r in rows}
    if len(names) > 1:
        raise ValueError(f"{path}: rows for several targets {sorted(names)}")
    tgt = TARGETS[names.pop()] if names else TARGETS["sm_90"]
    cases = sorted({c for r in rows for c in r.get("cases", [])})
    return AotReport(tgt, rows, path, seconds, cases)


__all__ = ["TARGETS", "Target", "AotReport", "AotError", "compile_kernels", "load_report", "target", "KERNELS_JSON"]
