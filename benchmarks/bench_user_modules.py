"""A user's own modules on every CPU backend against eager, side by side in one run.

    python benchmarks/bench_user_modules.py                     # T = 1024, every row, every backend
    python benchmarks/bench_user_modules.py --rows linear,gated-mlp --backends tvm --json out.json

Rows: one `nn.Linear(512, 3072)`, a `GatedMLP(512, 1536)` (SiLU-GLU), one KDA layer and one MLA
layer of the zoo's mixers (d = 512, 4 heads of 64 / MLA ranks 128), each on `[1, T, 512]`, and
`examples/diff_my_model.py`'s hybrid (two KDA layers and an MLA layer with latent MoE, d = 64)
on `[1, T]` token ids (its prefill). Each module is compiled once per backend with the
default capture (dynamic B and T); then, in each of `--repeat` rounds, every runner (eager
among them, each round starting one runner later) takes its turn on the same input:
`k3c.bench.timed_turn` settles, makes one untimed call, then times one. The table gives each
runner's fastest time and, as its ratio, the median over the rounds of eager seconds /
backend seconds in the same round (> 1: the backend is faster), so a slow spell of a shared
machine that spans a round hits both sides of a ratio.
Each backend's output is compared with eager's (rel RMS), so a fast wrong answer shows. Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import k3c
from k3c.bench import Progress, machine, timed_turn
from k3c.diff import format_table
from k3c.models.common import GatedMLP, init_weights
from k3c.models.kda_layer import KDAMixer
from k3c.models.mla_layer import MLAMixer
from k3c.numerics import rel_rms_err

BACKENDS = ("reference", "onnx", "onnx:ort", "tvm")
D = 512


class Mixer(torch.nn.Module):
    """A zoo token mixer as a user holds it: x -> y, no state kept."""

    def __init__(self, mixer: torch.nn.Module):
        super().__init__()
        self.mixer = mixer

    def forward(self, x):
        return self.mixer(x, None)[0]


def _hybrid():
    path = Path(__file__).resolve().parents[1] / "examples" / "diff_my_model.py"
    spec = importlib.util.spec_from_file_location("diff_my_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return init_weights(mod.MyModel(mod.MyConfig()), seed=0).eval()


def rows(T: int) -> dict:
    """name -> (module, example input). Every module's weights come from `init_weights` (seeded):
    the zoo's mixers leave A_log, dt_bias and the conv weights as `torch.empty` for a
    checkpoint or `init_weights` to fill, and timing uninitialised memory times whatever it
    holds (NaNs, subnormals)."""
    x = torch.randn(1, T, D, generator=torch.Generator().manual_seed(0))
    mla = MLAMixer(D, 4, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32,
                   v_head_dim=64, output_gate=True)
    hybrid = _hybrid()
    ids = torch.randint(0, hybrid.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    mods = {"linear": torch.nn.Linear(D, 3072), "gated-mlp": GatedMLP(D, 1536),
            "kda-layer": Mixer(KDAMixer(D, 4, 64)), "mla-layer": Mixer(mla)}
    return {**{k: (init_weights(m, seed=0).eval(), x) for k, m in mods.items()}, "hybrid": (hybrid, ids)}


def _call(fn, is_lm: bool):
    return (lambda x: fn.prefill(x)[0]) if is_lm else fn


def compile_all(name: str, module, x, backends, root: Path, progress: Progress) -> dict:
    runners = {}
    for spec in backends:
        backend, _, flavour = spec.partition(":")
        opts = {"flavour": flavour or "portable"} if backend == "onnx" else {}
        t0 = time.perf_counter()
        # a short example: the capture is dynamic in B and T, the run is at --seq-len
        example = x[:, :16]
        run = k3c.compile(module, backend, (example,), out_dir=root / f"{name}-{spec.replace(':', '-')}", **opts)
        runners[spec] = (run, time.perf_counter() - t0)
        progress.step(f"{name}: compiled for {spec} in {runners[spec][1]:.0f}s")
    return runners


def measure(module, x, runners: dict, repeat: int, progress: Progress, name: str) -> dict:
    is_lm = hasattr(module, "prefill")
    fns = {"eager": _call(module, is_lm), **{k: _call(r, is_lm) for k, (r, _) in runners.items()}}
    times = {k: [] for k in fns}
    outs = {}
    with torch.no_grad():
        for k, fn in fns.items():  # warm-up: first-run allocations, thread pools, sessions
            outs[k] = fn(x)
        names = list(fns)
        for i in range(repeat):
            for k in names[i % len(names):] + names[:i % len(names)]:  # each round starts one later
                times[k].append(timed_turn(lambda fn=fns[k]: fn(x)))  # settle, an untimed call, the timed one
            progress.step(f"{name}: round {i + 1}/{repeat}")
    # each round's eager time over the backend's time in that round, then the median of
    # those: a slow spell of the machine that spans a round hits both sides of its ratio
    ratios = {k: statistics.median(e / t for e, t in zip(times["eager"], times[k])) for k in fns}
    return {k: {"seconds": min(times[k]), "ratio_vs_eager": ratios[k], "times": times[k],
                "rel_rms_err": rel_rms_err(outs[k].float(), outs["eager"].float())} for k in fns}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--rows", default="linear,gated-mlp,kda-layer,mla-layer,hybrid")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    table = rows(args.seq_len)
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error(f"unknown row {unknown[0]!r}; rows: {', '.join(table)}")
    progress = Progress(len(names) * (len(backends) + args.repeat))
    results = {}
    with tempfile.TemporaryDirectory(prefix="k3c-bench-user-") as tmp:
        for name in names:
            module, x = table[name]
            module = init_weights(module, seed=1).eval() if not hasattr(module, "prefill") else module
            runners = compile_all(name, module, x, backends, Path(tmp), progress)
            results[name] = measure(module, x, runners, args.repeat, progress, name)
            for spec, (_, secs) in runners.items():
                results[name][spec]["compile_seconds"] = secs
    progress.close()
    m = machine()
    print(f"user modules, T = {args.seq_len}, B = 1, {args.repeat} rounds: fastest ms, median of the "
          f"rounds' eager/backend ratios; {m['processor']} ({m['cpus']} CPUs, "
          f"torch {m['torch']}, {m['torch_threads']} threads)")
    head = ["row", "eager ms"] + [f"{b} ms (x eager)" for b in backends]
    lines = [head]
    for name, r in results.items():
        lines.append([name, f"{r['eager']['seconds'] * 1e3:.1f}"]
                     + [f"{r[b]['seconds'] * 1e3:.1f} ({r[b]['ratio_vs_eager']:.2f}x)" for b in backends])
    print(format_table(lines))
    errs = [(r[b]["rel_rms_err"], name, b) for name, r in results.items() for b in backends]
    worst = max(errs, key=lambda e: math.inf if math.isnan(e[0]) else e[0])  # a NaN error is the worst
    print(f"largest rel RMS error vs eager: {worst[0]:.1e} ({worst[1]}, {worst[2]})")
    if args.json:
        Path(args.json).write_text(json.dumps({"seq_len": args.seq_len, "machine": m, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
