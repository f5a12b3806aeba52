"""The VM's parameters in one anonymous mapping on transparent huge pages (Linux, CPU).

A decode step streams every weight once, and with 4 KB pages each 4 KB of a weight costs a TLB
miss; in a virtual machine a miss walks two page tables. Measured on a 2-core AMD EPYC Zen 4
guest, torch's sum over 1 GiB of float32 on 2 threads: 28 to 35 GB/s on 4 KB pages, 62 to 66
GB/s on 2 MB pages (in other allocations as little as 35: BENCHMARKS.md); and a k3-small
release-precision decode step 5.43 ms with its parameters where TVM's allocator put them,
4.82 ms with them here (medians of 10 rounds in one process).

    huge_buffer(nbytes)   a uint8 torch tensor over a fresh mapping advised MADV_HUGEPAGE
                          (None where the OS has no transparent huge pages)
    place(params)         the parameters copied into one such mapping, each 64-byte aligned as
                          TVM requires, the originals dropped one by one (so a load holds at
                          most one parameter twice); unchanged where huge pages are unavailable

    trim()                glibc's malloc_trim: the freed originals handed back to the OS

The runner makes the parameters with a VM on TVM's naive allocator, so that the originals are
freed when dropped (the pooled allocator keeps freed blocks for reuse: the parameters would be
held twice). After the load a k3-small release runner adds 173 MiB to its process's resident
set with the parameters here, 201 MiB with them where TVM put them (166 MiB of parameters;
`python benchmarks/bench_tvm_load_memory.py DIR`). `K3C_HUGE_PAGES=0` keeps the parameters
where TVM allocated them (to compare the two).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import torch
import tvm

ALIGN = 64  # bytes: TVM's allocation alignment, which its kernels assume
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def available() -> bool:
    """Whether a mapping may be advised onto transparent huge pages here (and is wanted)."""
    if os.environ.get("K3C_HUGE_PAGES", "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in THP.read_text()
    except OSError:
        return False


def huge_buffer(nbytes: int) -> torch.Tensor | None:
    """`nbytes` of zeroed memory as a uint8 tensor, on huge pages where the kernel grants them
    (advised before the first touch); the tensor keeps its mapping alive."""
    if not available() or nbytes <= 0:
        return None
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(mm, dtype=torch.uint8)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def place(params: list) -> list:
    """The VM's CPU parameters (TVM tensors) copied into one huge-page mapping, in order; the
    list is emptied as it is read. Returns TVM tensors over the mapping (they keep it alive),
    or the parameters as they were where huge pages are unavailable."""
    views = [torch.from_dlpack(p) for p in params]
    buf = huge_buffer(sum(_aligned(v.numel() * v.element_size()) for v in views))
    if buf is None:
        return params
    out, at = [], 0
    for i, v in enumerate(views):
        n = v.numel() * v.element_size()
        dst = buf[at:at + n].view(v.dtype).view(v.shape)
        dst.copy_(v)
        out.append(tvm.runtime.from_dlpack(dst))
        views[i] = params[i] = None  # the original goes as soon as it is copied
        at += _aligned(n)
    return out


def trim() -> None:
    """Hand the C heap's free memory back to the OS (glibc's `malloc_trim`; elsewhere nothing):
    the parameters' originals, freed once copied, would otherwise stay resident."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
