"""The row write of a fixed-capacity cache in Triton, in place:

    cache[b, positions[b] + t, ...] = new[b, t, ...]      for t < T    (kernels/cache/naive.py)

A decode step moves one row a sequence, not the cache. One program copies one new row's
block of BC values (the dims after the row, flattened: the cache is [B, N, C] in memory);
a row that would land outside [0, N) is not written (the runners reject such positions
before any launch; the kernel never writes out of bounds whatever it is given). Offsets
are int64: b * N * C passes 2^31 at a 1M-row cache.
"""

from __future__ import annotations

import math

import torch

from ....errors import InputError
from ...common.triton import INTERPRET, check_device

import triton  # isort: skip  (after common.triton has chosen the mode)
import triton.language as tl  # isort: skip

BC = 1024  # values of a row per program on a GPU (4 warps, 8 a thread)


@triton.jit
def cache_write_kernel(cache, new, pos, s_cb, s_cn, s_nb, s_nt, T, N, C, BC: tl.constexpr):
    # grid (B * T, C / BC): the rows in x (CUDA's y stops at 65535)
    i_bt, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_b, i_t = i_bt // T, i_bt % T
    row = tl.load(pos + i_b).to(tl.int64) + i_t
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = (o_c < C) & (row >= 0) & (row < N)
    b_x = tl.load(new + i_b * s_nb + i_t * s_nt + o_c, mask=m_c)
    tl.store(cache + i_b * s_cb + row * s_cn + o_c, b_x.to(cache.dtype.element_ty), mask=m_c)


def check_positions(positions: torch.Tensor, T: int, N: int, what: str = "cache_write") -> None:
    """An InputError when a sequence's T new rows would not fit the N rows from its position
    (0 <= positions[b], positions[b] + T <= N); nothing to check on meta tensors."""
    if positions.is_meta or not positions.numel():
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0:
        raise InputError(f"{what}: position {lo} is negative")
    if hi + T > N:
        raise InputError(f"{what}: a sequence holds {hi} rows and {T} more do not fit the cache's {N} rows")


def cache_write(cache: torch.Tensor, new: torch.Tensor, positions: torch.Tensor, inplace: bool = True,
                check: bool = True) -> torch.Tensor:
    """The IR op `cache_write`: cache [B, N, ...], new [B, T, ...] of the cache's dtype,
    positions int64 [B] -> the cache with rows positions[b] + t of sequence b replaced by
    new[b, t]: `cache` itself, written in place (`inplace=False`: a copy). `check=False`
    skips the bounds check (a read of positions on the host) where the caller made it: the
    runners check each entry's positions against the capacity before it runs."""
    check_device("cache_write", cache, new, positions)
    B, N = cache.shape[:2]
    T = new.shape[1]
    if new.shape[0] != B or new.shape[2:] != cache.shape[2:] or positions.shape != (B,):
        raise InputError(f"cache_write: new rows {tuple(new.shape)} and positions {tuple(positions.shape)} do "
                         f"not fit the cache {tuple(cache.shape)}")
    if positions.dtype != torch.int64:
        raise InputError(f"cache_write: positions must be int64, got {positions.dtype}")
    if check:
        check_positions(positions, T, N)
    positions = positions.contiguous()  # the kernel reads positions[b] at pos + b
    out = cache if inplace else cache.clone()
    C = math.prod(cache.shape[2:])
    if out.numel() and new.numel():
        if not out.is_contiguous():
            raise InputError("cache_write: the cache must be contiguous (its rows are written in place)")
        new = new.reshape(B, T, C)
        if new.stride(-1) != 1:
            new = new.contiguous()
        bc = min(triton.next_power_of_2(C), 1 << 14 if INTERPRET else BC)
        cache_write_kernel[(B * T, triton.cdiv(C, bc))](out, new, positions, out.stride(0), out.stride(1),
                                                        new.stride(0), new.stride(1), T, N, C, BC=bc)
    return out
