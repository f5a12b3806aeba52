"""TVM targets by name: `llvm` is this CPU (its name for `-mcpu`, all cores), `cuda` a CUDA GPU
(`sm_90` unless an `arch` option says otherwise). TVM 0.27 takes targets as dicts."""

from __future__ import annotations

import os

import tvm

KINDS = ("llvm", "cuda")
# LLVM's names of the CPU features that decide which kernel form is fastest: vector width
# (panels of 16 or 32 columns), BF16 dot products, AMX tiles. The manifest records those of
# the target an artifact was built for.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16", "amx-tile",
                "amx-bf16", "amx-int8")


def make_target(name: str = "llvm", arch: str | None = None, mcpu: str | None = None) -> tvm.target.Target:
    """The `tvm.target.Target` of a target name ("llvm" or "cuda")."""
    if name == "llvm":
        cpu = mcpu or tvm.target.codegen.llvm_get_system_cpu()
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": os.cpu_count() or 1})
    if name == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": arch or "sm_90"})
    raise ValueError(f"unknown TVM target {name!r}; known: {', '.join(KINDS)}")


def cpu_features(target: tvm.target.Target) -> list[str]:
    """The CPU_FEATURES that an llvm `target` has ([] for other kinds)."""
    if target.kind.name != "llvm":
        return []
    have = tvm.target.codegen.llvm_get_cpu_features(target)
    return [f for f in CPU_FEATURES if f in have]
