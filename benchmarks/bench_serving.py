"""Serving forms side by side in one run: fixed-capacity decode at growing contexts,
last-token vs all-logits prefill, and `k3c generate` against eager generation.

    python benchmarks/bench_serving.py                          # k3-small, P = 1024, 16384, 65536
    python benchmarks/bench_serving.py --model k3-tiny --contexts 256,1024 --json out.json
    python benchmarks/bench_serving.py --decode-only --steps 4 --repeat 2      # the decode rows alone

Decode: each backend's artifact with fixed caches of capacity N (onnx: one artifact a context,
N = P + 64, because its masked attention spans the capacity; tvm: one artifact of the largest
N, its kernel reading only the rows below each position). The caches are filled to P rows
directly (random rows at the scale of real ones; `positions` = P), then `--steps` decode steps
are timed, the fastest of `--repeat` runs kept (a CPU shared with other work varies by 2x).
Prefill: T = `--prefill` tokens through `prefill` (all logits) and `prefill_last`.
Generate: greedy tokens per second of `k3c.generate.generate` through the onnx artifact and
through the eager model (the same prompt and cache capacity, that of the smallest artifact).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

import k3c
from k3c.bench import best_of, settle
from k3c.generate import EagerRunner, generate


def filled_state(compiled, model, P: int, seed: int = 0) -> dict:
    """A decode state whose caches hold P rows (random, unit scale), the rest zero."""
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        _, state = compiled.prefill(ids)
    N = compiled.max_context
    gen = torch.Generator().manual_seed(seed + 1)
    for k, v in state.items():
        if k != "positions" and v.dim() >= 2 and v.shape[1] == N:
            v[:, :P] = torch.randn(v[:, :P].shape, generator=gen)
    state["positions"] = torch.full((1,), P, dtype=torch.long)
    return state


def decode_step_ms(compiled, model, P: int, steps: int, repeat: int) -> float:
    tok = torch.zeros(1, 1, dtype=torch.long)

    def run():
        state = filled_state(compiled, model, P)
        settle()  # torch's fill of the caches leaves its threads spinning (k3c.bench.settle)
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(steps):
                _, state = compiled.decode(tok, state)
            run.t = time.perf_counter() - t0

    times = []
    for _ in range(repeat):
        run()
        times.append(run.t)
    return 1e3 * min(times) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--backends", default="onnx,tvm")
    ap.add_argument("--contexts", default="1024,16384,65536")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--decode-only", action="store_true", help="the decode rows alone (no prefill, no generate)")
    ap.add_argument("--json")
    args = ap.parse_args()
    model = k3c.models.build(args.model).eval()
    contexts = [int(c) for c in args.contexts.split(",")]
    backends = args.backends.split(",")
    root = Path(tempfile.mkdtemp(prefix="k3c-serving-"))
    ex = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    report = {"model": args.model, "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
              "decode_ms": {}, "prefill_ms": {}, "generate_tokens_per_s": {}}

    def artifact(be: str, N: int):
        opts = {"flavour": "ort"} if be == "onnx" else {}
        return k3c.compile(model, be, (ex,), out_dir=root / f"{be}-{N}", max_context=N, **opts)

    for be in backends:
        arts = {P: artifact(be, P + 64) for P in contexts} if be == "onnx" else \
            dict.fromkeys(contexts, artifact(be, max(contexts) + 64))
        report["decode_ms"][be] = {P: decode_step_ms(arts[P], model, P, args.steps, args.repeat) for P in contexts}
        print(be, "decode ms", report["decode_ms"][be], flush=True)
        if args.decode_only:
            continue
        # the smallest artifact that holds the prompt serves the prefill and generation rows
        pre = next((arts[P] for P in contexts if P + 64 >= args.prefill), None) or artifact(be, args.prefill)
        ids = torch.randint(0, model.config.vocab_size, (1, args.prefill))
        with torch.no_grad():
            report["prefill_ms"][be] = {lg: 1e3 * best_of(lambda lg=lg, pre=pre, ids=ids: pre.prefill(ids, logits=lg),
                                                      args.repeat)
                                        for lg in ("all", "last")}
        print(be, "prefill ms", report["prefill_ms"][be], flush=True)
        if be == "onnx":
            prompt = [ids[0, :16].tolist()]
            generate(pre, prompt, 2)  # warm-up: sessions
            report["generate_tokens_per_s"][be] = generate(pre, prompt, args.new_tokens)[1]["tokens_per_s"]
            eager = EagerRunner(model, pre.max_context)
            report["generate_tokens_per_s"]["eager"] = generate(eager, prompt, args.new_tokens)[1]["tokens_per_s"]
            print("generate tokens/s", report["generate_tokens_per_s"], flush=True)
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
