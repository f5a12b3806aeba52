"""The TVM panel GEMM on stored weights, kernel alone, against a plain read of the same bytes
in the same run: decode GEMVs (M = 1 and a batch of 8) and a prefill GEMM, BF16 and float32
weights, in GB/s of weight bytes (and GFLOP/s for the GEMM); then the MXFP4 routed-expert
kernels at k3-small's shapes (E = 32, D = 512, I = 256, top-4) for a decode step's tokens,
in GB/s of the expert bytes the step touches (the experts its tokens are routed to); then the
same expert kernels in a prefill of --prefill-tokens tokens on float32 and on MXFP4 panels,
in turns, in GFLOP/s (the release precision's experts beside fp32's).

    python benchmarks/bench_tvm_gemv.py                    # 3072 x 512 and 32768 x 512, experts
    python benchmarks/bench_tvm_gemv.py --shapes 3072x512 --repeat 200 --no-experts

The read reference is the fastest of numpy's single-thread OR-reduction of the bytes and
torch's int32 max over them (torch's threads); it runs first, before TVM's thread pool exists,
as TVM's workers spin after each call and slow a torch call that follows. Each time is the
minimum over `--repeat` calls. Not a test: nothing is asserted; the maximum error against
torch's float32 product is printed so a fast wrong kernel shows.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch


def fastest(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return []


def read_gbps(w: torch.Tensor, repeat: int) -> float:
    n = w.numel() * w.element_size()
    as_u64 = w.contiguous().view(torch.uint8).numpy().view(np.uint64)
    as_i32 = w.contiguous().view(torch.int32)
    return n / min(fastest(lambda: np.bitwise_or.reduce(as_u64), repeat), fastest(lambda: as_i32.max(), repeat)) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="3072x512,32768x512", help="N x K of the weights")
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--no-experts", action="store_true", help="skip the MXFP4 expert kernels")
    ap.add_argument("--prefill-tokens", type=int, default=1024, help="tokens of the expert prefill rows (0: none)")
    args = ap.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    gen = torch.Generator().manual_seed(0)
    weights = {(N, K, dt): torch.randn(N, K, generator=gen).to(dt)
               for N, K in shapes for dt in (torch.bfloat16, torch.float32)}
    reads = {key: read_gbps(w, args.repeat) for key, w in weights.items()}  # before TVM starts

    import tvm

    from k3c.backends.tvm.relax_ops import panel_width
    from k3c.backends.tvm.target import make_target
    from k3c.kernels.common.tvm.gemm import packed_linear, packed_rows

    c = panel_width()
    print(f"CPU flags: {' '.join(cpu_flags())}; TVM threads {os.environ['TVM_NUM_THREADS']}; panel {c}")
    print(f"{'weights':>18} {'dtype':>9} {'M':>4} {'us':>9} {'GB/s':>7} {'read GB/s':>9} {'GFLOP/s':>8} {'max err':>9}")
    for (N, K, dt), w in weights.items():
        P = -(-N // c)
        panels = torch.nn.functional.pad(w, (0, 0, 0, P * c - N)).reshape(P, c, K).permute(0, 2, 1).contiguous()
        wt = tvm.runtime.empty(tuple(panels.shape), str(dt).removeprefix("torch."), tvm.cpu())
        torch.from_dlpack(wt).copy_(panels)
        nbytes = w.numel() * w.element_size()
        for M in (1, 8, 256):
            rows = packed_rows(M < 256, c)  # the backend's choice: decode steps take the GEMV form
            lib = tvm.compile(packed_linear(K, N, rows, c, str(dt).removeprefix("torch.")), target=make_target("llvm"))
            x = torch.randn(M, K, generator=gen)
            xt, y = tvm.runtime.tensor(x.numpy()), tvm.runtime.empty((M, N), "float32", tvm.cpu())
            s = fastest(lambda lib=lib, xt=xt, wt=wt, y=y: lib(xt, wt, y), args.repeat)
            err = (torch.from_dlpack(y) - x @ w.float().T).abs().max().item()
            print(f"{N:>8} x {K:<7} {str(dt)[6:]:>9} {M:>4} {s * 1e6:>9.1f} {nbytes / s / 1e9:>7.1f} "
                  f"{reads[(N, K, dt)]:>9.1f} {2 * M * N * K / s / 1e9:>8.1f} {err:>9.1e}")
    if not args.no_experts:
        experts(args.repeat, gen)
        if args.prefill_tokens:
            expert_prefill(args.prefill_tokens, max(3, args.repeat // 20), gen)


def _tvm(t: torch.Tensor):
    import tvm

    out = tvm.runtime.empty(tuple(t.shape), str(t.dtype).removeprefix("torch."), tvm.cpu())
    torch.from_dlpack(out).copy_(t)
    return out


def experts(repeat: int, gen: torch.Generator, E: int = 32, D: int = 512, I: int = 256, k: int = 4) -> None:
    """The MXFP4 gate/up and down kernels of a decode step (rows = 1 a tile, the backend's
    choice for a step) at B = 1 and 8, with their error against the naive decode and GEMMs:
    the decode by arithmetic and by table (`lut`: 8 entries on AVX2, 16 on AVX-512, where the
    host has it), in turns."""
    import tvm
    from tvm import s_tir

    from k3c.backends.tvm.target import make_target, target_has
    from k3c.kernels.moe.naive import moe_down, moe_gate_up
    from k3c.kernels.moe.tvm import SCHEDULES, panel
    from k3c.kernels.moe.tvm import moe_down as tvm_down
    from k3c.kernels.moe.tvm import moe_gate_up as tvm_gate_up
    from k3c.kernels.mxfp4.naive import decode

    def panels(packed, scale):  # [E, out, in/2], [E, out, in/32] -> [E, out/F, in/32, 17, F]
        n_out, half, groups = packed.shape[1], packed.shape[2], scale.shape[-1]
        F = panel(n_out)
        codes = packed.reshape(E, n_out // F, F, groups, half // groups).permute(0, 1, 3, 4, 2)
        return torch.cat([codes, scale.reshape(E, n_out // F, F, groups, 1).permute(0, 1, 3, 4, 2)], 3).contiguous()

    def build(func):
        sch = s_tir.Schedule(func)
        SCHEDULES["llvm"](sch)
        return tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=make_target("llvm"))

    def experts_of(n_out: int, n_in: int):
        return (torch.randint(0, 256, (E, n_out, n_in // 2), dtype=torch.uint8, generator=gen),
                torch.randint(118, 130, (E, n_out, n_in // 32), dtype=torch.uint8, generator=gen))

    w13, w2 = experts_of(2 * I, D), experts_of(D, I)
    p13, p2 = _tvm(panels(*w13)), _tvm(panels(*w2))
    kernels = {lut: (build(tvm_gate_up(E, D, 2 * I, k, "llvm", 1, "mxfp4", lut)),
                     build(tvm_down(E, I, D, k, "llvm", 1, "mxfp4", lut)))
               for lut in (False, "avx2", *(["avx512"] if target_has("avx512f") else []))}
    print(f"MXFP4 experts (k3-small: E {E}, D {D}, I {I}, top-{k}), decode tiles of 1 row; GB/s of the")
    print("stored bytes (4.25 bits a weight) of the experts the step's tokens are routed to")
    print(f"{'kernel':>8} {'decode':>6} {'B':>3} {'experts':>8} {'us':>9} {'GB/s':>7} {'max err':>9}")
    for B in (1, 8):
        idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(B)])
        touched = idx.unique().numel()
        h, a = torch.randn(B, D, generator=gen), torch.randn(B, k, I, generator=gen)
        cw = torch.rand(B, k, generator=gen)
        cases = [(name, lut, lib, args, shape, want, weights) for lut, (gate_up, down) in kernels.items() for
                 name, lib, args, shape, want, weights in (
                     ("gate_up", gate_up, [h, p13, idx], (B, k, 2 * I), moe_gate_up(h, decode(*w13), idx), 2 * I * D),
                     ("down", down, [a, p2, idx, cw], (B, D), moe_down(a, decode(*w2), idx, cw), D * I))]
        for name, lut, lib, args, shape, want, weights in sorted(cases, key=lambda c: (c[0], c[1] or "")):
            args = [x if isinstance(x, tvm.runtime.Tensor) else _tvm(x) for x in args]
            out = _tvm(torch.zeros(shape))
            s = fastest(lambda lib=lib, args=args, out=out: lib(*args, out), repeat)
            err = (torch.from_dlpack(out) - want).abs().max().item()
            gbps = touched * weights * 17 / 32 / s / 1e9
            form = lut or "arith"
            print(f"{name:>8} {form:>6} {B:>3} {touched:>8} {s * 1e6:>9.1f} {gbps:>7.1f} {err:>9.1e}")


def expert_prefill(N: int, repeat: int, gen: torch.Generator, E: int = 32, D: int = 512, I: int = 256,
                   k: int = 4) -> None:
    """The routed-expert kernels of a prefill (tiles of 6 rows, the backend's choice) on float32
    panels and on MXFP4 panels (decoded by table where the target has AVX2, as the backend
    chooses), side by side, in GFLOP/s: the release precision's experts against fp32's."""
    import tvm
    from tvm import s_tir

    from k3c.backends.tvm.target import make_target, target_has
    from k3c.kernels.moe.naive import moe_down, moe_gate_up
    from k3c.kernels.moe.tvm import SCHEDULES, weight_panels
    from k3c.kernels.moe.tvm import moe_down as tvm_down
    from k3c.kernels.moe.tvm import moe_gate_up as tvm_gate_up
    from k3c.kernels.mxfp4.naive import decode

    def build(func):
        sch = s_tir.Schedule(func)
        SCHEDULES["llvm"](sch)
        return tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=make_target("llvm"))

    def panels(fmt, packed, scale):  # the layouts of kernels/moe/tvm (weight_panels)
        (_, n_out, n_in) = packed.shape[0], packed.shape[1], packed.shape[2] * 2
        shape, _ = weight_panels(fmt, E, n_out, n_in)
        F = shape[-1]
        if fmt == "float32":
            return decode(packed, scale).reshape(E, n_out // F, F, n_in).permute(0, 1, 3, 2).contiguous()
        groups = n_in // 32
        codes = packed.reshape(E, n_out // F, F, groups, 16).permute(0, 1, 3, 4, 2)
        return torch.cat([codes, scale.reshape(E, n_out // F, F, groups, 1).permute(0, 1, 3, 4, 2)], 3).contiguous()

    lut = "avx512" if target_has("avx512f") else "avx2" if target_has("avx2") else False  # the backend's choice
    w13 = (torch.randint(0, 256, (E, 2 * I, D // 2), dtype=torch.uint8, generator=gen),
           torch.randint(118, 130, (E, 2 * I, D // 32), dtype=torch.uint8, generator=gen))
    w2 = (torch.randint(0, 256, (E, D, I // 2), dtype=torch.uint8, generator=gen),
          torch.randint(118, 130, (E, D, I // 32), dtype=torch.uint8, generator=gen))
    idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(N)])
    h, a, cw = torch.randn(N, D, generator=gen), torch.randn(N, k, I, generator=gen), torch.rand(N, k, generator=gen)
    want = {"gate_up": moe_gate_up(h, decode(*w13), idx), "down": moe_down(a, decode(*w2), idx, cw)}
    print(f"Routed experts of a {N}-token prefill (tiles of 6 rows), float32 panels against MXFP4 "
          f"({f'{lut} table' if lut else 'arithmetic'} decode), in turns")
    print(f"{'kernel':>8} {'weights':>8} {'ms':>9} {'GFLOP/s':>8} {'max err':>9}")
    libs = {(name, fmt): build(fn(E, *dims, k, "llvm", 6, fmt, lut and fmt == "mxfp4"))
            for fmt in ("float32", "mxfp4")
            for name, fn, dims in (("gate_up", tvm_gate_up, (D, 2 * I)), ("down", tvm_down, (I, D)))}
    args = {("gate_up", fmt): [h, panels(fmt, *w13), idx] for fmt in ("float32", "mxfp4")}
    args.update({("down", fmt): [a, panels(fmt, *w2), idx, cw] for fmt in ("float32", "mxfp4")})
    best, outs = {}, {}
    for _ in range(repeat):  # turns, so a change of load hits both forms
        for key, lib in libs.items():
            ins = [_tvm(x) for x in args[key]]
            outs[key] = out = _tvm(torch.zeros(want[key[0]].shape))
            best[key] = min(best.get(key, float("inf")), fastest(lambda lib=lib, ins=ins, out=out: lib(*ins, out), 1))
    for (name, fmt), s in best.items():
        flops = 2 * N * k * (2 * I * D if name == "gate_up" else D * I)
        err = (torch.from_dlpack(outs[(name, fmt)]) - want[name]).abs().max().item()
        print(f"{name:>8} {fmt:>8} {s * 1e3:>9.2f} {flops / s / 1e9:>8.1f} {err:>9.1e}")


if __name__ == "__main__":
    main()
