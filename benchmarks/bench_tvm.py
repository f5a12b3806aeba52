"""TVM `llvm` against eager PyTorch and torch.compile (inductor, CPU) on k3-small:
prefill of T tokens, then N decode steps carrying the state.

    python benchmarks/bench_tvm.py                       # k3-small, B = 1, T = 1024, 64 steps
    python benchmarks/bench_tvm.py --T 256 --steps 8 --no-inductor --json tvm.json

Every runner sees the same token ids; each figure is the fastest of `--repeat` timed runs
(default 3) after one warm-up run (a warm-up also triggers torch.compile's compilation,
timed separately). Decode is timed as
the total of the N steps. The logits of each runner are checked against eager (k3c.numerics)
so that a fast wrong answer shows. Prints a markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

import k3c
from k3c.numerics import compare


def _time(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


REPEAT = 3


def _best(fn):
    """(output, seconds): the fastest of REPEAT timed runs (a shared CPU varies by 20% and more)."""
    best = None
    for _ in range(REPEAT):
        out, t = _time(fn)
        best = (out, t) if best is None or t < best[1] else best
    return best


def _decode_loop(step, state, ids, steps: int):
    logits = None
    for i in range(steps):
        logits, state = step(ids[:, i:i + 1], state)
    return logits, state


def run_eager(model, prompt, follow, steps):
    with torch.no_grad():
        model.prefill(prompt)  # warm-up
        (logits, state), t_pre = _best(lambda: model.prefill(prompt))
        _decode_loop(model.decode, state, follow, 2)  # warm-up
        (dec_logits, _), t_dec = _best(lambda: _decode_loop(model.decode, state, follow, steps))
    return {"prefill_s": t_pre, "decode_s": t_dec, "logits": logits, "decode_logits": dec_logits}


def run_inductor(model, prompt, follow, steps):
    torch._dynamo.config.cache_size_limit = 64
    prefill = torch.compile(model.prefill, dynamic=False)
    decode = torch.compile(model.decode, dynamic=True)
    with torch.no_grad():
        _, t_compile_pre = _time(lambda: prefill(prompt))
        (logits, state), t_pre = _best(lambda: prefill(prompt))
        _, t_compile_dec = _time(lambda: _decode_loop(decode, state, follow, 2))
        (dec_logits, _), t_dec = _best(lambda: _decode_loop(decode, state, follow, steps))
    return {"prefill_s": t_pre, "decode_s": t_dec, "compile_s": t_compile_pre + t_compile_dec,
            "logits": logits, "decode_logits": dec_logits}


def run_tvm(model, prompt, follow, steps, out_dir):
    t0 = time.perf_counter()
    cm = k3c.compile(model, "tvm", (prompt[:, :16],), out_dir=out_dir, passes="default")
    t_compile = time.perf_counter() - t0
    with torch.no_grad():
        cm.prefill(prompt)  # warm-up
        (logits, state), t_pre = _best(lambda: cm.prefill(prompt))
        _decode_loop(cm.decode, state, follow, 2)  # warm-up
        (dec_logits, _), t_dec = _best(lambda: _decode_loop(cm.decode, state, follow, steps))
    return {"prefill_s": t_pre, "decode_s": t_dec, "compile_s": t_compile, "timings": cm.timings,
            "logits": logits, "decode_logits": dec_logits}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="k3-small")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile (its compile takes minutes)")
    p.add_argument("--out", help="TVM artifact folder (default: a temporary one)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--repeat", type=int, default=REPEAT, help="timed runs per figure, fastest kept")
    args = p.parse_args()
    globals()["REPEAT"] = args.repeat

    model = k3c.models.build(args.model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.B, args.T + args.steps), generator=gen)
    prompt, follow = ids[:, :args.T], ids[:, args.T:]
    results = {"eager": run_eager(model, prompt, follow, args.steps)}
    out_dir = args.out or tempfile.mkdtemp(prefix="k3c-bench-tvm-")
    results["tvm"] = run_tvm(model, prompt, follow, args.steps, out_dir)
    if not args.no_inductor:
        results["torch.compile"] = run_inductor(model, prompt, follow, args.steps)

    eager = results["eager"]
    rows = []
    for name, r in results.items():
        pre, dec = compare(r["logits"], eager["logits"]), compare(r["decode_logits"], eager["decode_logits"])
        r["prefill_rel_rms"], r["decode_rel_rms"] = pre.rel_rms_err, dec.rel_rms_err
        rows.append((name, r))
    ind = results.get("torch.compile")
    print(f"\n{args.model}, B = {args.B}: prefill T = {args.T}, then {args.steps} decode steps; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| runner | prefill s | vs eager | vs torch.compile | decode s (all steps) | vs eager | vs torch.compile "
          "| compile s | logits rel. RMS (prefill / last decode) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        vs_ind = ("", "")
        if ind:
            vs_ind = (f"{ind['prefill_s'] / r['prefill_s']:.2f}x", f"{ind['decode_s'] / r['decode_s']:.2f}x")
        compile_s = f"{r['compile_s']:.0f}" if "compile_s" in r else ""
        print(f"| {name} | {r['prefill_s']:.2f} | {eager['prefill_s'] / r['prefill_s']:.2f}x | {vs_ind[0]} "
              f"| {r['decode_s']:.2f} | {eager['decode_s'] / r['decode_s']:.2f}x | {vs_ind[1]} | {compile_s} "
              f"| {r['prefill_rel_rms']:.1e} / {r['decode_rel_rms']:.1e} |")
    if args.json:
        clean = {n: {k: v for k, v in r.items() if not isinstance(v, torch.Tensor)} for n, r in results.items()}
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "B": args.B, "T": args.T, "steps": args.steps, "results": clean}, f,
                      indent=1)


if __name__ == "__main__":
    main()
