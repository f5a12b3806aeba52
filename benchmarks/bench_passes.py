"""The `default` pass pipeline on one model: interpreter time and estimated cost, before and after.

    python benchmarks/bench_passes.py [--model k3-small] [--T 1024] [--B 1] [--repeats 1] [--threads 1]

Captures the prefill graph, runs `default` (with its per-pass report), then interprets both
graphs on the same token ids (round-robin repeats, median) and checks that they agree. Prints
one table: interpreter seconds, estimated FLOPs and bytes (passes/cost.py at the same B, T),
node counts, and the before / after ratios. One torch thread by default: the interpreter
runs thousands of small ops, where more threads mostly add synchronisation.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

import k3c
from k3c import ir, passes
from k3c.numerics import compare


def median_seconds(fns: dict, repeats: int) -> dict:
    """Median wall time of each function, the repeats round-robin so load changes hit all alike."""
    times: dict = {k: [] for k in fns}
    results: dict = {}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            results[k] = fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = k3c.models.build(args.model)
    vocab = model.config.vocab_size
    t0 = time.perf_counter()
    graph = k3c.capture(model, (torch.randint(0, vocab, (2, 16)),))
    capture_s = time.perf_counter() - t0
    report: list = []
    t0 = time.perf_counter()
    fused = passes.run(graph, "default", report=report)
    passes_s = time.perf_counter() - t0

    ids = torch.randint(0, vocab, (args.B, args.T), generator=torch.Generator().manual_seed(1))
    seconds, outs = median_seconds({"before": lambda: ir.interpret(graph, ids),
                                    "after": lambda: ir.interpret(fused, ids)}, args.repeats)
    worst = max((compare(b, a) for a, b in zip(outs["before"], outs["after"])), key=lambda c: c.rel_rms_err)
    at = {"B": args.B, "T": args.T}
    cost = {"before": passes.graph_cost(graph, at), "after": passes.graph_cost(fused, at)}

    print(f"{args.model} prefill, B = {args.B}, T = {args.T}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"capture {capture_s:.1f} s, default pipeline {passes_s:.1f} s; after vs before: "
          f"max_abs_err {worst.max_abs_err:.1e}, rel_rms_err {worst.rel_rms_err:.1e} ({'ok' if worst.ok else 'OFF'})")
    rows = [("", "before", "after", "after / before"),
            ("interpreter seconds", f"{seconds['before']:.2f}", f"{seconds['after']:.2f}",
             f"{seconds['after'] / seconds['before']:.2f}"),
            ("estimated GFLOP", f"{cost['before'].flops / 1e9:.2f}", f"{cost['after'].flops / 1e9:.2f}",
             f"{cost['after'].flops / cost['before'].flops:.2f}"),
            ("estimated MB moved", f"{cost['before'].bytes / 1e6:.0f}", f"{cost['after'].bytes / 1e6:.0f}",
             f"{cost['after'].bytes / cost['before'].bytes:.2f}"),
            ("nodes", str(len(graph.nodes)), str(len(fused.nodes)), f"{len(fused.nodes) / len(graph.nodes):.2f}")]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print()
    print(passes.format_report(report))


if __name__ == "__main__":
    main()
