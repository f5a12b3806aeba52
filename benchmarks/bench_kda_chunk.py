"""KDA on the CPU: the chunked (WY/UT) form against the recurrent definition and against fla's
`naive_chunk_kda`, measured side by side in one run (warm-up, repeats, median).

    python benchmarks/bench_kda_chunk.py [--T 512 2048 8192] [--skip-recurrent-above 2048]

Prints one table row per length: median milliseconds per implementation and the ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from k3c.kernels.kda.chunk import chunk_kda
from k3c.kernels.kda.naive import naive_recurrent_kda


def make_inputs(B: int, T: int, H: int, K: int, V: int, seed: int = 0):
    """l2-normalised q, k as the models feed them; k3-style gates in [-5, 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = -5.0 * torch.sigmoid(torch.randn(B, T, H, K, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    return q, k, v, g, beta


def median_seconds(fn, warmup: int, repeats: int, clock=time.perf_counter) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def fla_naive_chunk():
    """fla's `naive_chunk_kda`, or None when fla is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fla.ops.kda.naive import naive_chunk_kda
    except ImportError:
        return None
    return naive_chunk_kda


def time_length(args: argparse.Namespace, T: int, fla_chunk) -> str:
    """One table row: the three implementations on the same inputs of length T."""
    q, k, v, g, beta = make_inputs(args.B, T, args.H, args.K, args.V)
    C = args.chunk_size
    fns = {"chunk": lambda: chunk_kda(q, k, v, g, beta, chunk_size=C)}
    if args.skip_recurrent_above is None or T <= args.skip_recurrent_above:
        fns["recurrent"] = lambda: naive_recurrent_kda(q, k, v, g, beta)
    if fla_chunk is not None and T % C == 0:
        fns["fla"] = lambda: fla_chunk(q, k, v, g, beta, output_final_state=True, chunk_size=C)
    clock = time.process_time if args.cpu_time else time.perf_counter
    t = {name: median_seconds(fn, args.warmup, args.repeats, clock) for name, fn in fns.items()}
    t_chunk, t_rec, t_fla = t["chunk"], t.get("recurrent"), t.get("fla")
    ms = lambda t: "-" if t is None else f"{t * 1e3:.1f}"
    ratio = lambda t: "-" if t is None else f"{t / t_chunk:.1f}x"
    return f"| {T} | {ms(t_chunk)} | {ms(t_rec)} | {ms(t_fla)} | {ratio(t_rec)} | {ratio(t_fla)} |"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--V", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-recurrent-above", type=int, default=None, metavar="N",
                    help="do not time the recurrent form for T > N")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the process's CPU time instead of the wall clock: on a shared "
                         "machine with --threads 1 this leaves out time spent waiting for a core")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    fla_chunk = fla_naive_chunk()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; B={args.B} H={args.H} K={args.K} V={args.V} "
          f"C={args.chunk_size}; {'CPU' if args.cpu_time else 'wall'} time, median of {args.repeats} "
          f"after {args.warmup} warm-up")
    print("| T | chunked ms | recurrent ms | fla naive_chunk ms | recurrent / chunked "
          "| fla naive_chunk / chunked |")
    print("|---|---|---|---|---|---|")
    for T in args.T:
        print(time_length(args, T, fla_chunk), flush=True)


if __name__ == "__main__":
    main()
