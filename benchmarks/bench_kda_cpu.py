"""KDA prefill on the CPU, every implementation side by side in one run: onnxruntime's C++
`com.microsoft::LinearAttention` (the `onnx:ort` flavour), k3c's TVM kernels, the portable
ONNX body, torch's chunked form and the recurrent definition.

    python benchmarks/bench_kda_cpu.py [--T 512 2048 8192] [--H 4 16] [--repeat 5]

Each backend compiles one module that calls the `kda` op on (q, k, v, g, beta, state), once
per H (T dynamic), as a user's module is compiled; every runner then takes the same inputs
in turn (round robin, fastest of `--repeat`; each turn is `k3c.bench.timed_turn`: settle, one
untimed call, the timed one). Errors are against the recurrent definition.
Prints a table per (H, T): milliseconds and the ratio to onnxruntime's C++ kernel.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import k3c
from k3c.bench import timed_turn
from k3c.kernels.kda.chunk import chunk_kda
from k3c.kernels.kda.naive import naive_recurrent_kda
from k3c.numerics import rel_rms_err

K = V = 64
BACKENDS = {"ort C++ LinearAttention": ("onnx", {"flavour": "ort"}), "tvm": ("tvm", {}),
            "onnx portable": ("onnx", {})}


# T dynamic, the state's H static: named, as the default could take a state dim for T
DIMS = {"q": "B T _ _", "k": "B T _ _", "v": "B T _ _", "g": "B T _ _", "beta": "B T _", "state": "B _ _ _"}


class KDACall(torch.nn.Module):
    def forward(self, q, k, v, g, beta, state):
        return k3c.kernels.ops.kda(q, k, v, g, beta, state, K**-0.5)


def inputs(B: int, T: int, H: int, seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1)
    g = -F.softplus(r(B, T, H, K)) * 0.2  # log-decays <= 0, k3-like
    return q, k, r(B, T, H, V), g, torch.sigmoid(r(B, T, H)), torch.zeros(B, H, K, V)


def timed(runners: dict, x: tuple, recurrent: bool) -> dict:
    """name -> a call on inputs `x`: each compiled artifact, torch's chunked form, the recurrence."""
    fns = {label: (lambda run=run: run(*x)) for label, run in runners.items()}
    fns["torch chunked"] = lambda: chunk_kda(*x[:5], scale=K**-0.5, initial_state=x[5])
    if recurrent:
        fns["torch recurrent"] = lambda: naive_recurrent_kda(*x[:5], scale=K**-0.5, initial_state=x[5])
    return fns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--H", type=int, nargs="+", default=[4, 16])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--recurrent-up-to", type=int, default=2048, help="the recurrence is timed up to this T")
    args = p.parse_args()
    print(f"{platform.machine()} ({os.cpu_count()} CPUs), torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads; B = 1, K = V = {K}, fp32", flush=True)
    root = Path(tempfile.mkdtemp(prefix="k3c-bench-kda-"))
    rows = []
    for H in args.H:
        runners = {}
        for label, (backend, opts) in BACKENDS.items():
            t0 = time.perf_counter()
            run = k3c.compile(KDACall(), backend, inputs(1, 16, H), out_dir=root / f"{label.split()[0]}-{H}",
                              force=True, dims=DIMS, **opts)
            runners[label] = run
            print(f"H = {H}: {label} compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        for T in args.T:
            x = inputs(1, T, H, seed=T)
            with torch.no_grad():
                ref = naive_recurrent_kda(*x[:5], scale=K**-0.5, initial_state=x[5])[0]  # the definition
                fns = timed(runners, x, T <= args.recurrent_up_to)
                best = {name: float("inf") for name in fns}
                errs = {}
                for name, fn in fns.items():  # warm-up, and the error of each
                    errs[name] = rel_rms_err(fn()[0], ref)
                for _ in range(args.repeat):
                    for name, fn in fns.items():  # settle, an untimed call, the timed one
                        best[name] = min(best[name], timed_turn(fn))
            anchor = best["ort C++ LinearAttention"]
            for name, s in best.items():
                rows.append((H, T, name, s * 1e3, s / anchor, errs[name]))
                print(f"H {H:3d}  T {T:5d}  {name:24s} {s * 1e3:9.2f} ms  {s / anchor:6.2f}x ort  "
                      f"rel RMS {errs[name]:.1e}", flush=True)
    print("\n| H | T | runner | ms | vs ort C++ | rel RMS vs recurrence |\n|---|---|---|---|---|---|")
    for H, T, name, ms, ratio, err in rows:
        print(f"| {H} | {T} | {name} | {ms:.2f} | {ratio:.2f}x | {err:.1e} |")


if __name__ == "__main__":
    main()
