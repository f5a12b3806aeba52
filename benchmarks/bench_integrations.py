"""k3c where users already are, side by side in one run on transformers' tiny Kimi Linear:
transformers eager, k3c through the transformers exporter backend (onnx, tvm),
torch.compile with inductor and with backend="k3c", and transformers' own ONNX exporter on
onnxruntime; a prefill and a decode step each.

    python benchmarks/bench_integrations.py                   # T = 256, min of 5 turns
    python benchmarks/bench_integrations.py --seq-len 512 --repeat 12 --json out.json
    python benchmarks/bench_integrations.py --rows "transformers eager,transformers exporter (onnx)"

The model is transformers' `KimiLinearForCausalLM` at kimi-linear-tiny's config, its own
random init (run from outside the repository root: its folders are k3c's source). transformers
takes fla's GPU kernels whenever fla is importable, so `fla` is blocked first, as the tests do.
Each row: its setup time (export / compile, the first calls), then the fastest of `--repeat`
turns of a prefill of T tokens and of one decode step after it, each turn through
`k3c.bench.timed_turn` (transformers' cache grows a row a call; k3c's state is a value). The
torch.compile rows compile transformers' forward (prefill, then a decode step with its
cache); with backend="k3c" the graphs k3c cannot take run eagerly, and the row says how many.
The "transformers exporter (onnx)" row exports with transformers' `OnnxExporter` (needs
`onnxscript`: `pip install -e .[bench]`; without it the row is skipped) and runs its prefill and
decode graphs on onnxruntime's CPU provider. It exports with static shapes at this T, since the
export unrolls KDA's chunk loop to the traced chunk count (its prefill is right only at T's chunk
count), and with onnxscript's optimiser off (on, the export at T = 64 took 261 s against 41 s on
2 cores; on and with dynamic shapes, it ran past 15 minutes); its setup is the export (on 2 cores:
41 s at T = 64 and 256, 54 s at T = 512).
Every row's prefill logits are compared with eager's (the first row's, when eager runs later).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

sys.modules["fla"] = None  # transformers must take its PyTorch paths (fla's kernels need a GPU)

import torch  # noqa: E402


def hf_model():
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    from k3c.models import config_for
    from k3c.models.checkpoint import kimi_config_to_json

    torch.manual_seed(0)
    config = KimiLinearConfig(**kimi_config_to_json(config_for("kimi-linear-tiny")))
    return KimiLinearForCausalLM(config).eval()


def best(fn, repeat: int) -> float:
    from k3c.bench import timed_turn

    return min(timed_turn(fn) for _ in range(repeat))


def eager_row(model, ids, step):
    def prefill():
        return model(ids, use_cache=True)

    def decode():  # the cache grows a row a turn (MLA layers), as in generation
        return model(step, cache=prefill_out.cache, use_cache=True)

    prefill_out = prefill()
    return prefill, decode, prefill_out.logits, ""


def exporter_row(model, ids, step, backend: str):
    from transformers.exporters import AutoHfExporter

    from k3c.integrations.transformers import K3cExportConfig  # registers export format "k3c"

    config = K3cExportConfig(backend=backend)
    exported = AutoHfExporter.from_config(config).export_for_generation(model, {"input_ids": ids[:, :8]}, config)
    run_prefill, run_decode = exported.runners["prefill"], exported.runners["decode"]
    state = run_prefill(input_ids=ids).cache
    return (lambda: run_prefill(input_ids=ids), lambda: run_decode(input_ids=step, cache=state),
            run_prefill(input_ids=ids).logits, "")


def compile_row(model, ids, step, backend: str, options: dict | None = None):
    from k3c.integrations import torch_compile as tc

    tc.stats.reset()
    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend, options=options)
    prefill_out = fn(ids, use_cache=True)
    cache = prefill_out.cache

    def decode():  # the cache grows a row a turn (MLA layers), as in generation: P from T to T + 2 repeats
        return fn(step, cache=cache, use_cache=True)

    decode()
    note = ""
    if backend == "k3c":
        note = f"k3c compiled {tc.stats.compiles} graph(s), {len(tc.stats.fallbacks)} ran eagerly"
        if tc.stats.fallbacks:
            note += f" (first: {tc.stats.fallbacks[0][1][:120]})"
    return lambda: fn(ids, use_cache=True), decode, prefill_out.logits, note


class Skipped(Exception):
    """A row whose packages are missing: it says which, and the others run."""


def hf_onnx_row(model, ids, step):
    """transformers' `OnnxExporter`, static shapes at this T and onnxscript's optimiser off, on ORT's CPU provider."""
    try:
        import onnxruntime as ort
        import onnxscript  # noqa: F401  (the exporter's translator)
        from transformers.exporters import AutoHfExporter, OnnxConfig
    except ImportError as err:
        raise Skipped(f"needs onnxscript and transformers' ONNX exporter: {err} (pip install -e .[bench])") from err

    config = OnnxConfig(dynamic=False, optimize=False)
    with contextlib.redirect_stdout(sys.stderr):  # torch.onnx prints its progress
        exported = AutoHfExporter.from_config(config).export_for_generation(model, {"input_ids": ids}, config)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT's constant folding warns about every CastLike it leaves
    exported.to("cpu", session_options=options)
    run_prefill, run_decode = exported.runners["prefill"], exported.runners["decode"]
    T = ids.shape[1]
    positions, step_position = torch.arange(T)[None], torch.tensor([[T]])
    out = run_prefill(input_ids=ids, position_ids=positions)
    return (lambda: run_prefill(input_ids=ids, position_ids=positions),
            lambda: run_decode(input_ids=step, position_ids=step_position, cache=out.cache),
            out.logits, f"static T = {T}, optimize=False, ORT CPU")


ROWS = {
    "transformers eager": lambda m, i, s: eager_row(m, i, s),
    "k3c exporter (onnx)": lambda m, i, s: exporter_row(m, i, s, "onnx"),
    "k3c exporter (tvm)": lambda m, i, s: exporter_row(m, i, s, "tvm"),
    "torch.compile inductor": lambda m, i, s: compile_row(m, i, s, "inductor"),
    "torch.compile backend=k3c": lambda m, i, s: compile_row(m, i, s, "k3c", {"backend": "onnx"}),
    "transformers exporter (onnx)": lambda m, i, s: hf_onnx_row(m, i, s),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated, from: " + ", ".join(ROWS))
    ap.add_argument("--json")
    args = ap.parse_args()
    from k3c.bench import machine
    from k3c.numerics import compare

    model = hf_model()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq_len + 1), generator=gen)
    ids, step = ids[:, :-1], ids[:, -1:]
    results, want = {}, None
    print(f"tiny Kimi Linear (transformers), B = 1, T = {args.seq_len}, min of {args.repeat} turns; {machine()}")
    print(f"{'row':28s} {'setup s':>8s} {'prefill ms':>11s} {'decode ms':>10s}  logits vs eager")
    for name in args.rows.split(","):
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                prefill, decode, logits, note = ROWS[name](model, ids, step)
                setup = time.perf_counter() - t0
                p, d = best(prefill, args.repeat), best(decode, args.repeat)
        except Skipped as why:
            results[name] = {"skipped": str(why)}
            print(f"{name:28s} skipped: {why}")
            continue
        except Exception as err:  # a row that cannot run says why; the others still run
            results[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
            print(f"{name:28s} failed: {results[name]['error']}")
            continue
        want = logits if want is None else want
        c = compare(logits.float(), want.float())
        results[name] = {"setup_s": setup, "prefill_s": p, "decode_step_s": d, "rel_rms_vs_eager": c.rel_rms_err,
                         "ok": c.ok, "note": note}
        print(f"{name:28s} {setup:8.1f} {p * 1e3:11.2f} {d * 1e3:10.3f}  {c.rel_rms_err:.1e} "
              f"{'ok' if c.ok else 'OFF'}{'  ' + note if note else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seq_len": args.seq_len, "repeat": args.repeat, "machine": machine(), "rows": results}, f,
                      indent=2)


if __name__ == "__main__":
    main()
