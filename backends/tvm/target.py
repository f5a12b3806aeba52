"""TVM targets by name: `llvm` is this CPU (its name for `-mcpu`, all cores), `cuda` a CUDA GPU
(`sm_90` unless an `arch` option says otherwise). TVM 0.27 takes targets as dicts."""

from __future__ import annotations

import os

import tvm

KINDS = ("llvm", "cuda")


def make_target(name: str = "llvm", arch: str | None = None, mcpu: str | None = None) -> tvm.target.Target:
    """The `tvm.target.Target` of a target name ("llvm" or "cuda")."""
    if name == "llvm":
        cpu = mcpu or tvm.target.codegen.llvm_get_system_cpu()
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": os.cpu_count() or 1})
    if name == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": arch or "sm_90"})
    raise ValueError(f"unknown TVM target {name!r}; known: {', '.join(KINDS)}")
