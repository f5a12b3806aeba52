"""Schedules of the TensorIR functions that Relax legalizes and fuses from standard ops.

The hand-written kernels arrive already scheduled (see `LowerContext.kernel`); what is left
are fused GEMMs, norms, softmaxes and elementwise chains. Both targets use `s_tir.dlight`'s
`ApplyDefaultSchedule` with a list of rules, first match wins:

- cuda: dlight's GPU defaults (Matmul, GEMV, Reduction, GeneralReduction, Fallback).
- llvm: `CpuMatmul` (register-tiled GEMM with its epilogue, parallel tiles, vector columns),
  dlight's CPU `Reduction` (softmax / norms), `CpuInjective` (elementwise chains inlined,
  flattened, parallel and vectorized) and `CpuParallel` (anything else: outer loops in
  parallel). A rule that does not fit returns None, so the next one is tried; a function no
  rule fits stays as legalized (correct, serial).
"""

from __future__ import annotations

import functools

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule, get_extent
from tvm.target import Target


def _is_llvm(target: Target) -> bool:
    return target.kind.name == "llvm"


def _safe(apply):
    """A rule that fails midway is a rule that does not apply: try the next."""

    @functools.wraps(apply)
    def wrapped(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not _is_llvm(target):
            return None
        try:
            return apply(self, func, target, tunable)
        except Exception:  # noqa: BLE001  (any failure: the rule does not apply)
            return None

    return wrapped


def _inline_spatial(sch: s_tir.Schedule, blocks, keep) -> None:
    """compute_inline every injective block except `keep`; reverse_compute_inline the rest."""
    for info in blocks:
        if info.block_rv == keep or not info.is_injective():
            continue
        try:
            sch.compute_inline(info.block_rv)
        except Exception:  # noqa: BLE001
            try:
                sch.reverse_compute_inline(info.block_rv)
            except Exception:  # noqa: BLE001
                pass


class CpuMatmul(ScheduleRule):
    """out[..., m, n] = sum_k a[..., m, k] b[..., k, n] (+ injective epilogue).

    Tiles of `rows` x `cols` outputs accumulate in registers (`cache_write` to local), the
    columns in vectors; the k loop runs inside the tile; tiles run in parallel, column tiles
    outermost so that consecutive tiles share a strip of b.
    """

    def __init__(self, rows: int = 4, cols: int = 16, lanes: int = 8):
        self.rows, self.cols, self.lanes = rows, cols, lanes

    @_safe
    def apply(self, func, target, _):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        mains = [b for b in infos if b.is_reduction()]
        if len(mains) != 1 or mains[0].dom_kind().count("R") != 1 or not mains[0].dom_kind().endswith("SR"):
            return None
        main = mains[0].block_rv
        if len(sch.get(main).writes) != 1 or len(sch.get(main).reads) != 2:
            return None
        _inline_spatial(sch, infos, main)
        *batch, m, n, k = sch.get_loops(main)
        mo, mi = sch.split(m, factors=[None, self.rows])
        no, ni = sch.split(n, factors=[None, self.cols])
        sch.reorder(*batch, no, mo, k, mi, ni)
        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, mo, preserve_unit_loops=True)
        outer = sch.fuse(*batch, no, mo)
        sch.parallel(outer)
        sch.unroll(mi)
        sch.vectorize(ni)
        consumers = sch.get_consumers(acc)
        while consumers:  # epilogues: into the write-back of the tile when elementwise
            try:
                sch.reverse_compute_inline(consumers[0])
            except Exception:  # noqa: BLE001
                sch.reverse_compute_at(consumers[0], outer)
                sch.vectorize(sch.split(sch.get_loops(consumers[0])[-1], factors=[None, self.lanes])[1])
            consumers = sch.get_consumers(acc)
        sch.vectorize(sch.get_loops(acc)[-1])
        sch.decompose_reduction(main, k)
        return sch


class CpuInjective(ScheduleRule):
    """Elementwise chains: inline into the last block, flatten it, parallel chunks of vectors."""

    def __init__(self, lanes: int = 8, chunk: int = 4096):
        self.lanes, self.chunk = lanes, chunk

    @_safe
    def apply(self, func, target, _):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos or not all(b.is_injective() for b in infos):
            return None
        last = infos[-1].block_rv
        _inline_spatial(sch, infos, last)
        loops = sch.get_loops(last)
        if not loops:
            return sch
        fused = sch.fuse(*loops)
        extent = get_extent(sch, fused)
        if isinstance(extent, int) and extent <= self.lanes:
            return sch
        outer, inner = sch.split(fused, factors=[None, self.lanes])
        if not isinstance(extent, int) or extent > self.chunk:
            sch.parallel(outer)
        sch.vectorize(inner)
        return sch


class CpuReduction(dl.cpu.Reduction):
    """dlight's CPU rule for softmax and norms, made safe to try."""

    @_safe
    def apply(self, func, target, tunable):
        return super().apply(func, target, tunable)


class CpuParallel(ScheduleRule):
    """Anything else: inline what can be, run each block's outer spatial loops in parallel."""

    @_safe
    def apply(self, func, target, _):
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        _inline_spatial(sch, infos, infos[-1].block_rv)
        done = False
        for info in normalize_prim_func(sch) or []:
            kinds = info.dom_kind()
            lead = len(kinds) - len(kinds.lstrip("S"))
            loops = sch.get_loops(info.block_rv)
            if lead == 0 or len(loops) < lead:
                continue
            try:
                sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])
                done = True
            except Exception:  # noqa: BLE001
                continue
        return sch if done else None


def default_schedule(target: Target) -> tvm.transform.Pass:
    """The pass that schedules every unscheduled PrimFunc of a module for `target`."""
    if target.kind.name == "cuda":
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    return dl.ApplyDefaultSchedule(CpuMatmul(), CpuReduction(), CpuInjective(), CpuParallel())
