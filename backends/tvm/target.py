"""TVM targets by name: `llvm` is this CPU (its name for `-mcpu`, the features its OS enables,
all cores), `llvm -mcpu=NAME` another CPU (a build for a machine that is not this one), `cuda` a
CUDA GPU (`sm_90` unless an `arch` option says otherwise). TVM 0.27 takes targets as dicts.

The CPU features that choose a kernel form (CPU_FEATURES) are decided once, when the module is
lowered, from the target: the manifest records them, and a library is loaded only on a host
that has every one of them (`check_host`): a kernel built with AVX-512 BF16 dot products would
otherwise stop the process with an illegal instruction.
"""

from __future__ import annotations

import functools
import os
import re

import tvm

from ...errors import ArtifactError, UsageError

KINDS = ("llvm", "cuda")
# LLVM's names of the CPU features that decide which kernel form is fastest: vector width
# (panels of 16 or 32 columns), BF16 dot products, AMX tiles. The manifest records those of
# the target an artifact was built for.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16", "amx-tile",
                "amx-bf16", "amx-int8")
# /proc/cpuinfo's names where they differ from LLVM's `f.replace("-", "_")`
OS_NAMES = {"avx512bf16": "avx512_bf16", "avx512vnni": "avx512_vnni"}
_MCPU = re.compile(r"^llvm\s+-mcpu=([\w.-]+)$")


def parse(target: str) -> tuple[str, str | None]:
    """("llvm", None) for "llvm", ("llvm", NAME) for "llvm -mcpu=NAME", ("cuda", None) for "cuda"."""
    text = str(target).strip()
    m = _MCPU.match(text)
    if m:
        if not tvm.target.codegen.llvm_is_valid_cpu(m.group(1), tvm.target.codegen.llvm_get_system_triple()):
            raise UsageError(f"tvm target {text!r}: LLVM knows no CPU {m.group(1)!r} (e.g. sapphirerapids, znver4, "
                             f"x86-64-v3)")
        return "llvm", m.group(1)
    if text in KINDS:
        return text, None
    raise UsageError(f"unknown TVM target {text!r}; known: {', '.join(KINDS)}, or 'llvm -mcpu=NAME' for another CPU")


def _llvm_features(cpu: str) -> set[str]:
    return set(tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": cpu})))


@functools.cache
def host_features() -> tuple[str, ...]:
    """The CPU_FEATURES this host can run: the flags its OS reports (a hypervisor or a kernel
    may hide AVX-512 or AMX that the CPU model has); LLVM's view of the CPU without /proc."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(line.split(":", 1)[1].split() for line in f if line.startswith("flags")))
    except (OSError, StopIteration):
        have = _llvm_features(tvm.target.codegen.llvm_get_system_cpu())
        return tuple(f for f in CPU_FEATURES if f in have)
    return tuple(f for f in CPU_FEATURES if OS_NAMES.get(f, f.replace("-", "_")) in flags)


def make_target(name: str = "llvm", arch: str | None = None, mcpu: str | None = None) -> tvm.target.Target:
    """The `tvm.target.Target` of a target name ("llvm", "llvm -mcpu=NAME" or "cuda"); `mcpu`
    names another CPU for "llvm". This host's llvm target turns off what its OS does not enable."""
    kind, named = parse(name)
    if kind == "llvm":
        cpu = mcpu or named
        if cpu is not None:
            return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": os.cpu_count() or 1})
        cpu = tvm.target.codegen.llvm_get_system_cpu()
        off = [f"-{f}" for f in CPU_FEATURES if f in _llvm_features(cpu) and f not in host_features()]
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": os.cpu_count() or 1,
                                  **({"mattr": off} if off else {})})
    return tvm.target.Target({"kind": "cuda", "arch": arch or "sm_90"})


def cpu_features(target: tvm.target.Target) -> list[str]:
    """The CPU_FEATURES that an llvm `target` has ([] for other kinds)."""
    if target.kind.name != "llvm":
        return []
    have = tvm.target.codegen.llvm_get_cpu_features(target)
    return [f for f in CPU_FEATURES if f in have]


def has(target: tvm.target.Target, feature: str) -> bool:
    return feature in cpu_features(target)


@functools.cache
def target_has(feature: str, mcpu: str | None = None) -> bool:
    """Whether the llvm target of `mcpu` (None: this host's) has CPU feature `feature`."""
    return has(make_target("llvm", mcpu=mcpu), feature)


def check_host(features: list[str], where: str, built_for: str = "") -> None:
    """An ArtifactError, one line, when this host lacks a CPU feature an artifact was built with."""
    missing = [f for f in features if f not in host_features()]
    if missing:
        m = re.search(r'"mcpu":\s*"([\w.-]+)"', built_for)  # the name in a Target's text, not the whole dict
        cpu = f" (-mcpu={m.group(1)})" if m else ""
        raise ArtifactError(f"{where} was built for a CPU{cpu} with {', '.join(missing)}, which this host "
                            f"lacks; compile it here (--target llvm) to run it")
