"""The TVM panel GEMM on stored weights, kernel alone, against a plain read of the same bytes
in the same run: decode GEMVs (M = 1 and a batch of 8) and a prefill GEMM, BF16 and float32
weights, in GB/s of weight bytes (and GFLOP/s for the GEMM).

    python benchmarks/bench_tvm_gemv.py                    # 3072 x 512 and 32768 x 512
    python benchmarks/bench_tvm_gemv.py --shapes 3072x512 --repeat 200

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


if __name__ == "__main__":
    main()
