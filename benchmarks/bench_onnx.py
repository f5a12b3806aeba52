"""ONNX artifacts vs eager torch: prefill of T tokens and N decode steps, one run each.

    python benchmarks/bench_onnx.py                      # k3-small, T = 1024, 64 decode steps
    python benchmarks/bench_onnx.py --model k3-tiny --prefill 256 --decode 16 --json out.json

Every runner gets the same prompt and the same next tokens (teacher forcing), so the work is
identical; a warm-up call on a short prompt comes first (session creation, first-run
allocations). The runners take turns, `--repeat` rounds of one prefill and the whole decode
loop each, and each keeps its fastest: on a CPU shared with other work single timings vary by
2x and more, and a shift over minutes would otherwise fall on one runner.
The ratios are eager seconds / onnxruntime seconds (> 1: onnxruntime faster). The last logits
of each backend are compared with eager's, so a fast wrong answer shows.
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
from k3c.backends.onnx import OnnxBackend
from k3c.bench import settle
from k3c.compiler import prepare
from k3c.numerics import rel_rms_err


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def eager_round(model, ids, steps):
    """One prefill and the decode loop through the eager model: (last logits, seconds, seconds)."""
    with torch.no_grad():
        (logits, state), t_pre = timed(model.prefill, ids)
        t0 = time.perf_counter()
        for x in steps:
            logits, state = model.decode(x, state)
        return logits, t_pre, time.perf_counter() - t0


def onnx_round(runner, ids, steps):
    """The same through an ONNX artifact's sessions."""
    names = [o["state"] for o in runner.manifest["entries"]["prefill"]["outputs"][1:]]
    order = [i["state"] for i in runner.manifest["entries"]["decode"]["inputs"][1:]]
    outs, t_pre = timed(runner.run, "prefill", ids)
    state = dict(zip(names, outs[1:]))
    t0 = time.perf_counter()
    for x in steps:
        outs = runner.run("decode", x, *[state[n] for n in order])
        state = dict(zip(names, outs[1:]))
    return outs[0], t_pre, time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="k3-small")
    p.add_argument("--prefill", type=int, default=1024, help="prompt length T")
    p.add_argument("--decode", type=int, default=64, help="decode steps")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--pipeline", default="default")
    p.add_argument("--repeat", type=int, default=3, help="timings repeated, fastest kept")
    p.add_argument("--flavours", default="portable,ort")
    p.add_argument("--out", help="artifact folder (default: a temporary one)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = k3c.models.build(args.model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prefill + args.decode), generator=gen)
    prompt, steps = ids[:, :args.prefill], [ids[:, t:t + 1] for t in range(args.prefill, ids.shape[1])]

    t0 = time.perf_counter()
    captured = k3c.capture_entries(model, (prompt[:, :16],))
    result = {"model": args.model, "batch": args.batch, "prefill_tokens": args.prefill, "decode_steps": args.decode,
              "repeat": args.repeat,
              "pipeline": args.pipeline, "threads": torch.get_num_threads(), "cpu": platform.processor() or "?",
              "cores": os.cpu_count(), "capture_and_passes_seconds": round(time.perf_counter() - t0, 2), "rows": {}}
    print(f"{args.model}: captured in {result['capture_and_passes_seconds']:.1f}s")

    root = Path(args.out or tempfile.mkdtemp(prefix="k3c-bench-onnx-"))
    rounds = {"eager": (eager_round, model)}
    lowered = {}
    for flavour in args.flavours.split(","):
        be = OnnxBackend(flavour)
        graphs = prepare(captured, be, args.pipeline)  # the pipeline as the flavour runs it
        _, lowered[flavour] = timed(be.lower, graphs, root / flavour)
        runner = be.load(root / flavour)
        rounds[f"onnx-{flavour}"] = (onnx_round, runner)
    for fn, obj in rounds.values():  # warm-up: sessions, first-run allocations, on a short prompt
        fn(obj, prompt[:, :16], steps[:1])
    best = {name: [None, float("inf"), float("inf")] for name in rounds}
    for r in range(args.repeat):  # rounds, each runner once a round: a shift of the machine's speed
        for name, (fn, obj) in rounds.items():  # over minutes falls on every runner alike
            settle()  # the last runner's threads idle first (k3c.bench.settle)
            logits, t_pre, t_dec = fn(obj, prompt, steps)
            b = best[name]
            b[0], b[1], b[2] = logits, min(b[1], t_pre), min(b[2], t_dec)
        print(f"round {r + 1}/{args.repeat} done", flush=True)
    ref, e_pre, e_dec = best["eager"]
    result["rows"]["eager"] = {"prefill_seconds": e_pre, "decode_seconds": e_dec}
    print(f"eager         prefill {e_pre:8.2f}s   decode {e_dec:8.2f}s")
    for name, (logits, t_pre, t_dec) in best.items():
        if name == "eager":
            continue
        row = {"prefill_seconds": t_pre, "decode_seconds": t_dec, "lower_seconds": lowered[name[5:]],
               "prefill_ratio_vs_eager": e_pre / t_pre, "decode_ratio_vs_eager": e_dec / t_dec,
               "last_logits_rel_rms_vs_eager": rel_rms_err(logits, ref)}
        result["rows"][name] = row
        print(f"{name:13s} prefill {t_pre:8.2f}s ({row['prefill_ratio_vs_eager']:.2f}x)   decode {t_dec:8.2f}s "
              f"({row['decode_ratio_vs_eager']:.2f}x)   last logits rel RMS {row['last_logits_rel_rms_vs_eager']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
