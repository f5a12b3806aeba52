"""k3-small as K3 is released (BF16 weights with the release's F32 tensors, MXFP4 routed
experts) beside k3-small in fp32, on onnxruntime and TVM: artifact bytes, prefill of T tokens
and N decode steps, each against eager torch on the same weights, in one run.

    python benchmarks/bench_release_precision.py               # k3-small, T = 1024, 64 decode steps
    python benchmarks/bench_release_precision.py --model k3-tiny --prefill 128 --decode 8

The release-precision model is the fp32 one's weights rounded to BF16 and its experts encoded
to MXFP4 (same seed). The CPU backends compute it in float32 from the stored weights; eager
computes it in BF16 and decodes each expert it routes to on the fly. Every runner gets the same
prompt and next tokens; a warm-up call on a 16-token prompt comes first; each measurement is
repeated `--repeat` times and the fastest kept. Ratios are eager seconds / backend seconds.
`last logits rel RMS` is against the same model in float32 on the same weights
(models.precision.fp32_copy), the yardstick of a float32 computation.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

import k3c
from k3c.models.precision import fp32_copy
from k3c.numerics import max_abs_err, rel_rms_err


def fastest(fn, repeat: int) -> tuple[object, float]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def prefill_and_decode(runner, prompt, steps, repeat: int) -> tuple[torch.Tensor, float, float]:
    """`runner` has prefill(ids) -> (logits, state) and decode(ids, state) (eager or compiled)."""
    with torch.no_grad():
        _, state = runner.prefill(prompt[:, :16])  # warm-up
        runner.decode(steps[0], state)
        (logits, state), t_pre = fastest(lambda: runner.prefill(prompt), repeat)

        def loop():
            lg, st = logits, state
            for x in steps:
                lg, st = runner.decode(x, st)
            return lg

        last, t_dec = fastest(loop, repeat)
    return last, t_pre, t_dec


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="k3-small")
    p.add_argument("--prefill", type=int, default=1024, help="prompt length T")
    p.add_argument("--decode", type=int, default=64, help="decode steps")
    p.add_argument("--repeat", type=int, default=3, help="timings repeated, fastest kept")
    p.add_argument("--backends", default="onnx:ort,tvm")
    p.add_argument("--precisions", default="fp32,bf16+mxfp4", help="which of fp32, bf16+mxfp4 to run")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    load = os.getloadavg()[0]
    result = {"model": args.model, "prefill_tokens": args.prefill, "decode_steps": args.decode,
              "repeat": args.repeat, "threads": torch.get_num_threads(), "cores": os.cpu_count(),
              "load_average_at_start": round(load, 2), "rows": []}
    print(f"{args.model}: T = {args.prefill}, {args.decode} decode steps, load average {load:.1f} "
          f"on {os.cpu_count()} cores", flush=True)
    gen = torch.Generator().manual_seed(0)
    root = Path(tempfile.mkdtemp(prefix="k3c-bench-precision-"))
    for precision in args.precisions.split(","):
        if precision not in ("fp32", "bf16+mxfp4"):
            raise SystemExit(f"--precisions: {precision!r} is not fp32 or bf16+mxfp4")
        kw = {} if precision == "fp32" else {"dtype": torch.bfloat16, "experts": "mxfp4"}
        model = k3c.models.build(args.model, **kw)
        yardstick = model if precision == "fp32" else fp32_copy(model)
        ids = torch.randint(0, model.config.vocab_size, (1, args.prefill + args.decode), generator=gen)
        gen.manual_seed(0)  # both precisions see the same tokens
        prompt, steps = ids[:, :args.prefill], [ids[:, t:t + 1] for t in range(args.prefill, ids.shape[1])]
        ref, _, _ = prefill_and_decode(yardstick, prompt, steps, 1)
        last, e_pre, e_dec = prefill_and_decode(model, prompt, steps, args.repeat)
        weights = sum(t.numel() * t.element_size() for t in {id(t): t for t in model.state_dict().values()}.values())
        row = {"precision": precision, "runner": "eager", "bytes": weights, "prefill_seconds": e_pre,
               "decode_seconds": e_dec, "last_logits_rel_rms": rel_rms_err(last.float(), ref)}
        result["rows"].append(row)
        print(f"{precision:11s} eager      weights {weights / 2**20:8.1f} MiB  prefill {e_pre:7.2f}s  "
              f"decode {e_dec:7.2f}s  rel RMS {row['last_logits_rel_rms']:.1e}", flush=True)
        for spec in args.backends.split(","):
            name, _, flavour = spec.partition(":")
            out = root / f"{precision}-{spec.replace(':', '-')}"
            t0 = time.perf_counter()
            options = {"flavour": flavour} if flavour else {}
            compiled = k3c.compile(model, name, (prompt[:, :16],), out_dir=out, **options)
            t_compile = time.perf_counter() - t0
            last, t_pre, t_dec = prefill_and_decode(compiled, prompt, steps, args.repeat)
            row = {"precision": precision, "runner": spec, "bytes": folder_bytes(out), "compile_seconds": t_compile,
                   "prefill_seconds": t_pre, "decode_seconds": t_dec, "prefill_vs_eager": e_pre / t_pre,
                   "decode_vs_eager": e_dec / t_dec, "last_logits_rel_rms": rel_rms_err(last.float(), ref),
                   "last_logits_max_abs": max_abs_err(last.float(), ref)}
            result["rows"].append(row)
            print(f"{precision:11s} {spec:10s} artifact {row['bytes'] / 2**20:7.1f} MiB  prefill {t_pre:7.2f}s "
                  f"({row['prefill_vs_eager']:.2f}x)  decode {t_dec:7.2f}s ({row['decode_vs_eager']:.2f}x)  "
                  f"rel RMS {row['last_logits_rel_rms']:.1e}  max abs {row['last_logits_max_abs']:.1e}  "
                  f"(compile {t_compile:.0f}s)", flush=True)
    result["load_average_at_end"] = round(os.getloadavg()[0], 2)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
