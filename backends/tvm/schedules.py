"""Schedules of the TensorIR functions that Relax legalizes and fuses from standard ops.

The hand-written kernels arrive already scheduled (see `LowerContext.kernel`); what is left
are fused GEMMs, norms, softmaxes and elementwise chains. Both targets use `s_tir.dlight`'s
`ApplyDefaultSchedule` with a list of rules, first match wins:

- cuda: dlight's GPU defaults (Matmul, GEMV, Reduction, GeneralReduction, Fallback).
- llvm: `CpuSchedule`, which tries in order `CpuMatmul` (register-tiled GEMM with its
  epilogue, parallel tiles, vector columns), dlight's CPU `Reduction` (softmax / norms),
  `CpuInjective` (elementwise chains inlined, flattened, parallel and vectorized) and
  `CpuParallel` (anything else: outer loops in parallel). A rule that does not fit is
  skipped; a function no rule fits stays as legalized (correct, serial).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule, get_extent
from tvm.target import Target


def _is_llvm(target: Target) -> bool:
    return target.kind.name == "llvm"


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


class CpuMatmul:
    """out[..., m, n] = sum_k a[..., m, k] b[..., k, n] (+ injective epilogue).

    Tiles of `rows` x `cols` outputs accumulate in registers (`cache_write` to local), the
    columns in vectors; the k loop runs inside the tile; tiles run in parallel, column tiles
    outermost so that consecutive tiles share a strip of b. Narrow shapes get narrower tiles
    (a decode step has one row).
    """

    def __init__(self, rows: int = 4, cols: int = 32, lanes: int = 8):
        self.rows, self.cols, self.lanes = rows, cols, lanes

    @staticmethod
    def fits(sch: s_tir.Schedule, infos) -> bool:
        mains = [b for b in infos if b.is_reduction()]
        if len(mains) != 1 or mains[0].dom_kind().count("R") != 1 or not mains[0].dom_kind().endswith("SR"):
            return False
        block = sch.get(mains[0].block_rv)
        return len(block.writes) == 1 and len(block.reads) == 2 and len(sch.get_loops(mains[0].block_rv)) >= 3

    @staticmethod
    def _tile(extent, full: int) -> int:
        """The tile of a dim: `full`, or for a static dim the largest power of two up to `full`
        that divides it (a ragged tile would need a per-lane predicate, which stops
        vectorization)."""
        if not isinstance(extent, int):
            return full
        tile = full
        while tile > 1 and extent % tile:
            tile //= 2
        return tile

    def schedule(self, sch: s_tir.Schedule, infos) -> None:
        main = next(b for b in infos if b.is_reduction()).block_rv
        _inline_spatial(sch, infos, main)
        *batch, m, n, k = sch.get_loops(main)
        m_extent = get_extent(sch, m)
        rows = min(self.rows, m_extent) if isinstance(m_extent, int) else self.rows
        cols = self._tile(get_extent(sch, n), self.cols)
        mo, mi = sch.split(m, factors=[None, rows])
        no, ni = sch.split(n, factors=[None, cols])
        sch.reorder(*batch, no, mo, k, mi, ni)
        acc = sch.cache_write(main, 0, "global")  # a stack array, not a workspace allocation (common/tvm.scratch)
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


class CpuInjective:
    """Elementwise chains: inline into the last block; its innermost loop in vectors (when
    its static extent divides into them, else left serial), the loops outside it fused and
    in parallel."""

    def __init__(self, lanes: int = 8, small: int = 4096):
        self.lanes, self.small = lanes, small

    @staticmethod
    def fits(sch: s_tir.Schedule, infos) -> bool:
        return all(b.is_injective() for b in infos)

    def schedule(self, sch: s_tir.Schedule, infos) -> None:
        last = infos[-1].block_rv
        _inline_spatial(sch, infos, last)
        loops = sch.get_loops(last)
        if not loops:
            return
        outer = list(loops)
        inner = get_extent(sch, loops[-1])
        lanes = CpuMatmul._tile(inner, self.lanes) if isinstance(inner, int) else 1
        if lanes > 1:
            io, ii = sch.split(loops[-1], factors=[None, lanes])
            sch.vectorize(ii)
            outer = outer[:-1] + [io]
        elif len(outer) > 1:
            # no vectors: keep the innermost loop as a plain serial loop, so that its indices
            # advance by one rather than by a division and a remainder per element
            outer = outer[:-1]
            lanes = inner if isinstance(inner, int) else 64
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        extent = get_extent(sch, fused)
        if not isinstance(extent, int) or extent * lanes > self.small:
            sch.parallel(fused)


class CpuParallel:
    """Anything else: inline what can be, run each block's outer spatial loops in parallel."""

    @staticmethod
    def fits(sch: s_tir.Schedule, infos) -> bool:
        return True

    def schedule(self, sch: s_tir.Schedule, infos) -> None:
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
        if not done:
            raise ValueError("no parallel loop")


class CpuSchedule(ScheduleRule):
    """The llvm rules in order: GEMM, dlight's CPU Reduction (softmax, norms), elementwise,
    parallel outer loops. The function's blocks are analysed once; a rule that fails midway
    leaves the next one a fresh schedule."""

    def __init__(self):
        self.reduction = dl.cpu.Reduction()
        self.rules = [CpuMatmul(), "reduction", CpuInjective(), CpuParallel()]

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not _is_llvm(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        for rule in self.rules:
            if rule == "reduction":
                if all(b.is_injective() for b in infos):
                    continue
                try:
                    out = self.reduction.apply(func, target, tunable)
                except Exception:  # noqa: BLE001
                    out = None
                if out is not None:
                    return out
                continue
            if not rule.fits(sch, infos):
                continue
            try:
                rule.schedule(sch, infos)
                return sch
            except Exception:  # noqa: BLE001  (any failure: the rule does not apply)
                sch = s_tir.Schedule(func)
                infos = normalize_prim_func(sch)
        return None


def default_schedule(target: Target) -> tvm.transform.Pass:
    """The pass that schedules every unscheduled PrimFunc of a module for `target`."""
    if target.kind.name == "cuda":
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    return dl.ApplyDefaultSchedule(CpuSchedule())
