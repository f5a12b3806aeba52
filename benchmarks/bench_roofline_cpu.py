"""k3c's CPU artifacts against this machine's own limits, measured in the same run.

    python benchmarks/bench_roofline_cpu.py                        # k3-small, P = T = 1024, 64 decode steps
    python benchmarks/bench_roofline_cpu.py --quick                # k3-tiny, 64 tokens, 4 steps (checks the script)
    python benchmarks/bench_roofline_cpu.py --backends onnx:ort --json roofline.json
    python benchmarks/bench_roofline_cpu.py --backends tvm --compute f32,bf16   # the release artifact both ways

Yardsticks first (torch on --threads threads): read bandwidth (a sum over a 1 GiB float32
tensor on transparent huge pages, where the TVM runner holds its weights; on 4 KB pages the
same sum may read about half, and that figure is printed beside it), the fp32 and bf16 GEMM
rates at 2048^3, the CPU's name and its avx2 / avx512f / avx512_bf16 / amx_bf16 flags. Then
each backend runs the model in fp32 and as released (BF16, MXFP4 routed experts), side by
side in one process, the runners taking turns
(k3c.bench.timed_turn: settle, one untimed call, the timed one; the fastest of --repeat kept):

- a decode step at B = 1 and B = 8 after a prompt of P = --prefill tokens, as a multiple of its
  bandwidth floor: bytes read per step / read bandwidth. Bytes read = the weights a step reads,
  in the dtype the backend holds them in (HELD below), plus the decode state at P (fp32).
  Routed experts: the expected number of distinct experts B tokens route to under uniform
  routing, E (1 - (1 - k/E)^B), per MoE layer. The B = 8 state is the B = 1 prompt's state
  repeated (each row decodes its own token, so rows route differently).
  Beside it, the multiple of its roofline: the larger of that floor and the step's FLOPs at
  the GEMM rate of the precision it computes in (at B = 8 a BF16 weight feeds 8 rows of fp32
  FMAs: 8 FLOP a byte, which two cores may not compute at the read bandwidth). The read
  bandwidth is measured again after the runs, and the floors take the larger of the two.
  The host's bandwidth may move within a run, so the yardstick also runs just before every
  timed decode turn (a sum over TURN_MIB MiB, the last runner's threads settled), and each
  row gives its step beside the floor at the bandwidth read before the turn it was fastest in
  ("x turn floor").
- the prefill of T = --prefill tokens as a share of the GEMM rate of the precision it computes
  in (the artifact manifest's compute policy: bf16 GEMMs take the bf16 rate, else fp32), FLOPs
  from k3c.models.stats (causal attention summed over the prompt).

A multiple of 1.0 is the floor; the prefill share is at most 1. Every row names the machine
it ran on. Not a test: nothing is asserted on speed.
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
from k3c.backends.tvm.arena import available as huge_available
from k3c.backends.tvm.arena import huge_buffer
from k3c.bench import best_of, settle, timed_turn
from k3c.models.stats import model_stats

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
PRECISIONS = {"fp32": {}, "bf16+mxfp4": {"dtype": torch.bfloat16, "experts": "mxfp4"}}
# Bytes a weight is held in while a decode step reads it, per (backend, precision, class).
# onnxruntime's CPU provider has no bf16 MatMul, Gemm, FusedMatMul or MatMulNBits kernel (an
# InferenceSession refuses each), so a BF16 weight reaches its GEMM through a Cast that
# onnxruntime folds at session creation: a float32 copy. A decode step of at most E / 2 slots
# gathers its routed experts as the exact int8 blocks of backends/onnx/ort_mxfp4.py (1.125
# bytes), a larger one runs the experts with slots through the 4-bit pair (1.25). TVM holds
# BF16 weights as stored, widens them in registers, and decodes MXFP4 codes inside its GEMMs
# (0.53125 bytes). Portable ONNX decodes every expert's codes on every call.
MXFP4_BYTES = 17 / 32  # a 4-bit code and a 1-byte scale per 32
HELD = {
    "fp32": {"dense": 4.0, "experts": 4.0, "experts_read": "routed"},
    ("onnx:ort", "bf16+mxfp4"): {"dense": 4.0, "experts": 1.125, "experts_read": "routed",
                                 "experts_past_half": 1.25},
    # TVM reads the BF16 weights and the nibble-packed MXFP4 panels as stored (relax_ops, quant_ops)
    ("tvm", "bf16+mxfp4"): {"dense": 2.0, "experts": MXFP4_BYTES, "experts_read": "routed"},
    ("onnx", "bf16+mxfp4"): {"dense": 4.0, "experts": MXFP4_BYTES, "experts_read": "all"},
}
BATCHES = (1, 8)
TURN_MIB = 256  # the yardstick before each timed decode turn: a sum over this many MiB (about 10 ms)


def cpu() -> dict:
    """The CPU's model name and which of FLAGS it has (Linux /proc/cpuinfo)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"name": name, "cores": os.cpu_count(), **{f: f in flags for f in FLAGS}}


def machine_label(info: dict) -> str:
    have = "/".join(f for f in FLAGS if info[f]) or "no avx2"
    return f"{info['name']} ({have}, {info['cores']} cores)"


def read_bandwidth(mib: int, repeat: int, huge: bool = True) -> float:
    """Bytes per second of a sum over a float32 tensor of `mib` MiB (torch's threads), on
    transparent huge pages where the OS has them (`huge`): the machine's best, as the TVM
    runner holds its weights there (backends/tvm/arena.py); 4 KB pages read about half."""
    buf = huge_buffer(mib * 2**20) if huge else None
    x = buf.view(torch.float32).fill_(1) if buf is not None else torch.ones(mib * 2**20 // 4)
    seconds = best_of(lambda: x.sum(), repeat, warmup=1)
    return x.numel() * 4 / seconds


def gemm_rate(dtype: torch.dtype, n: int, repeat: int) -> float:
    """FLOP per second of an n^3 matmul in `dtype` (torch: oneDNN / MKL)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    seconds = best_of(lambda: a @ b, repeat, warmup=1)
    return 2 * n**3 / seconds


def weight_classes(model: torch.nn.Module) -> dict:
    """Element counts of the weights a decode step reads: routed experts (per MoE layer,
    per expert), embedding rows, the rest (dense, read whole)."""
    cfg = model.config
    dense = experts = 0
    embed_width = 0
    for name, t in model.state_dict().items():
        if ".experts." in name:
            # MXFP4 codes hold two weights a byte; their scales are counted in MXFP4_BYTES
            experts += 2 * t.numel() if name.endswith("_packed") else 0 if name.endswith("_scale") else t.numel()
        elif "embed_tokens" in name:
            embed_width = t.shape[1]
        else:
            dense += t.numel()
    moe_layers = max(1, sum(1 for n in model.state_dict() if n.endswith("experts.w13")
                            or n.endswith("experts.w13_packed")))
    return {"dense": dense, "per_expert": experts // (moe_layers * cfg.num_experts), "moe_layers": moe_layers,
            "experts": cfg.num_experts, "top_k": cfg.top_k, "embed_width": embed_width}


def decode_bytes(classes: dict, held: dict, state_bytes: int, batch: int) -> float:
    """Bytes one decode step of `batch` tokens reads (see the module docstring)."""
    E, k = classes["experts"], classes["top_k"]
    distinct = E if held["experts_read"] == "all" else E * (1 - (1 - k / E) ** batch)
    per_weight = held["experts"] if batch * k <= E / 2 else held.get("experts_past_half", held["experts"])
    experts = classes["moe_layers"] * distinct * classes["per_expert"] * per_weight
    embed = batch * classes["embed_width"] * held["dense"]
    return classes["dense"] * held["dense"] + experts + embed + batch * state_bytes


def flops_of(name: str, T: int, layers: int | None) -> tuple[float, float]:
    """(FLOPs of a T-token prefill, FLOPs of one token decoded after it). model_stats averages
    attention over a prefill of T (position t attends to t keys, mean (T + 1) / 2), so the
    prefill is T times its per-token total, and a token at context T + 1 pays twice that
    average attention."""
    s = model_stats(name if layers is None else build(name, {}, layers, "meta"), seq_len=T)["flops_per_token"]
    return T * s["total"], s["total"] + s["attention"]


def build(name: str, precision: dict, layers: int | None, device: str | None = None) -> torch.nn.Module:
    extra = {"num_layers": layers} if layers else {}
    if device:
        extra["device"] = device
    return k3c.models.build(name, **precision, **extra)


def compile_runner(model, spec: str, prompt: torch.Tensor, out: Path,
                   compute: str | None = None) -> tuple[object, float, dict]:
    name, _, flavour = spec.partition(":")
    options = {"flavour": flavour} if flavour else {}
    if compute is not None:
        options["compute"] = compute
    t0 = time.perf_counter()
    compiled = k3c.compile(model, name, (prompt[:, :16],), out_dir=out, **options)
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {}
    return compiled, time.perf_counter() - t0, manifest.get("compute") or {}


def turn_bandwidth(mib: int, threads: int, repeat: int = 3) -> float:
    """The read bandwidth between runs (the host's moves within a run): the last runner's
    threads settled, then the yardstick on `threads` torch threads."""
    settle()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return read_bandwidth(mib, repeat)
    finally:
        torch.set_num_threads(before)


def measure(runners: list[dict], prompt: torch.Tensor, steps: int, repeat: int, vocab: int,
            turn_mib: int = TURN_MIB, threads: int = 2) -> None:
    """Prefill and decode-step seconds of every runner, taking turns; fastest kept, with the
    read bandwidth measured just before that turn."""
    gen = torch.Generator().manual_seed(1)
    tokens = {b: [torch.randint(0, vocab, (b, 1), generator=gen) for _ in range(steps)] for b in BATCHES}
    states = {}
    with torch.no_grad():
        for r in runners:  # the prompt's state, once per runner (B = 8: repeated rows)
            _, st = r["compiled"].prefill(prompt)
            states[r["key"]] = {b: {n: v.repeat_interleave(b, 0) for n, v in st.items()} for b in BATCHES}
        for turn in range(repeat):
            for r in runners:
                print(f"  turn {turn + 1}/{repeat}: {r['key']}", flush=True)
                t = timed_turn(lambda c=r["compiled"]: c.prefill(prompt))
                r["prefill_s"] = min(r.get("prefill_s", t), t)
                for b in BATCHES:
                    def loop(c=r["compiled"], st=states[r["key"]][b], xs=tokens[b]):
                        for x in xs:
                            c.decode(x, st)  # every step from the prompt's state: the step at P
                    bw = turn_bandwidth(turn_mib, threads)
                    t = timed_turn(loop) / steps
                    if t < r.get(f"decode_b{b}_s", float("inf")):
                        r[f"decode_b{b}_s"], r[f"decode_b{b}_bw"] = t, bw


def markdown(rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def table(result: dict) -> str:
    rows = [("backend", "precision", "held (dense / expert bytes a weight)", "prefill s", "% GEMM peak",
             *(f"decode B={b} ms" for b in BATCHES), *(f"x floor B={b}" for b in BATCHES),
             *(f"x turn floor B={b} (GB/s)" for b in BATCHES),
             *(f"x roofline B={b}" for b in BATCHES), "machine")]
    for r in result["rows"]:
        rows.append((r["backend"], r["precision"], f"{r['held']['dense']:g} / {r['held']['experts']:.3g}",
                     f"{r['prefill_seconds']:.3f}", f"{100 * r['prefill_share_of_peak']:.1f}% {r['peak']}",
                     *(f"{1e3 * r['decode'][str(b)]['seconds']:.2f}" for b in BATCHES),
                     *(f"{r['decode'][str(b)]['multiple_of_floor']:.2f}" for b in BATCHES),
                     *(f"{r['decode'][str(b)]['multiple_of_turn_floor']:.2f} "
                       f"({r['decode'][str(b)]['turn_read_bytes_per_s'] / 1e9:.1f})" for b in BATCHES),
                     *(f"{r['decode'][str(b)]['multiple_of_roofline']:.2f}" for b in BATCHES), r["machine"]))
    return markdown(rows)


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="k3-small")
    p.add_argument("--prefill", type=int, default=1024, help="prompt length P = prefill length T")
    p.add_argument("--decode", type=int, default=64, help="decode steps a measurement averages over")
    p.add_argument("--repeat", type=int, default=3, help="turns per runner, fastest kept")
    p.add_argument("--backends", default="onnx:ort,tvm")
    p.add_argument("--precisions", default="fp32,bf16+mxfp4")
    p.add_argument("--compute", default="f32",
                   help="compute policies of the release-precision artifacts, e.g. f32,bf16 (one artifact each)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the yardsticks")
    p.add_argument("--bandwidth-mib", type=int, default=1024)
    p.add_argument("--gemm-n", type=int, default=2048)
    p.add_argument("--layers", type=int, help="build the model with this many layers (a smaller check)")
    p.add_argument("--quick", action="store_true",
                   help="k3-tiny, 64 tokens, 4 steps, small yardsticks: checks that the script works")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.prefill, args.decode, args.repeat = "k3-tiny", 64, 4, 1
        args.bandwidth_mib, args.gemm_n = 64, 256
    for prec in args.precisions.split(","):
        if prec not in PRECISIONS:
            p.error(f"--precisions: {prec!r} is not one of {', '.join(PRECISIONS)}")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    info = cpu()
    label = machine_label(info)
    print(f"machine: {label}; load average {os.getloadavg()[0]:.1f}", flush=True)
    bw = read_bandwidth(args.bandwidth_mib, max(3, args.repeat))
    small_pages = read_bandwidth(args.bandwidth_mib, max(3, args.repeat), huge=False)
    pages = "2 MB pages" if huge_available() else "4 KB pages"
    print(f"read bandwidth {bw / 1e9:.1f} GB/s (sum over {args.bandwidth_mib} MiB on {pages}; "
          f"{small_pages / 1e9:.1f} GB/s on 4 KB pages)", flush=True)
    peaks = {d: gemm_rate(getattr(torch, t), args.gemm_n, max(3, args.repeat)) for d, t in
             (("fp32", "float32"), ("bf16", "bfloat16"))}
    print(f"GEMM {args.gemm_n}^3: fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s",
          flush=True)
    torch.set_num_threads(threads)
    result = {"model": args.model, "prefill_tokens": args.prefill, "decode_steps": args.decode,
              "repeat": args.repeat, "machine": {**info, "label": label},
              "yardsticks": {"read_bytes_per_s": bw, "read_pages": pages, "read_bytes_per_s_4k_pages": small_pages,
                             "gemm_flops_per_s": peaks, "threads": args.threads,
                             "bandwidth_mib": args.bandwidth_mib, "gemm_n": args.gemm_n},
              "load_average_at_start": round(os.getloadavg()[0], 2), "rows": []}
    state_bytes = model_stats(args.model if args.layers is None else build(args.model, {}, args.layers, "meta"),
                              seq_len=args.prefill, dtype=torch.float32)["state_bytes"]["total"]
    flops, step_flops = flops_of(args.model, args.prefill, args.layers)
    root = Path(tempfile.mkdtemp(prefix="k3c-roofline-"))
    runners = []
    gen = torch.Generator().manual_seed(0)
    prompt = None
    for prec in args.precisions.split(","):
        model = build(args.model, PRECISIONS[prec], args.layers)
        vocab = model.config.vocab_size
        if prompt is None:
            prompt = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=gen)
        classes = weight_classes(model)
        for spec in args.backends.split(","):
            for policy in (["f32"] if prec == "fp32" else args.compute.split(",")):
                label_prec = prec if policy == "f32" else f"{prec}, {policy} compute"
                print(f"compiling {args.model} {label_prec} for {spec}", flush=True)
                compiled, seconds, compute = compile_runner(
                    model, spec, prompt, root / f"{prec}-{policy}-{spec.replace(':', '-')}",
                    None if policy == "f32" else policy)
                held = HELD["fp32"] if prec == "fp32" else HELD.get((spec, prec))
                if held is None:
                    raise SystemExit(f"no held-bytes entry for {spec} at {prec}: add one to HELD")
                runners.append({"key": f"{spec} {label_prec}", "backend": spec, "precision": label_prec,
                                "compiled": compiled, "compile_s": seconds, "compute": compute, "held": held,
                                "classes": classes})
        del model
    settle()
    measure(runners, prompt, args.decode, args.repeat, vocab, min(TURN_MIB, args.bandwidth_mib), args.threads)
    bw_end = turn_bandwidth(args.bandwidth_mib, args.threads, max(3, args.repeat))
    print(f"read bandwidth at the end {bw_end / 1e9:.1f} GB/s; the floors take the larger", flush=True)
    result["yardsticks"]["read_bytes_per_s_at_end"] = bw_end
    bw = max(bw, bw_end)
    for r in runners:
        peak = "bf16" if r["compute"].get("policy") == "bf16" else "fp32"
        row = {"backend": r["backend"], "precision": r["precision"], "machine": label, "held": r["held"],
               "compute": r["compute"], "compile_seconds": r["compile_s"], "prefill_seconds": r["prefill_s"],
               "prefill_flops": flops, "peak": peak, "prefill_share_of_peak": flops / r["prefill_s"] / peaks[peak],
               "decode": {}}
        for b in BATCHES:
            nbytes = decode_bytes(r["classes"], r["held"], state_bytes, b)
            floor = nbytes / bw
            compute_floor = b * step_flops / peaks[peak]  # the GEMM rate of the precision it computes in
            roofline = max(floor, compute_floor)
            turn_bw = r[f"decode_b{b}_bw"]
            row["decode"][str(b)] = {"seconds": r[f"decode_b{b}_s"], "bytes_read": nbytes, "floor_seconds": floor,
                                     "multiple_of_floor": r[f"decode_b{b}_s"] / floor, "flops": b * step_flops,
                                     "turn_read_bytes_per_s": turn_bw,
                                     "multiple_of_turn_floor": r[f"decode_b{b}_s"] * turn_bw / nbytes,
                                     "compute_floor_seconds": compute_floor, "roofline_seconds": roofline,
                                     "multiple_of_roofline": r[f"decode_b{b}_s"] / roofline}
        result["rows"].append(row)
    result["load_average_at_end"] = round(os.getloadavg()[0], 2)
    result["table"] = table(result)
    print(result["table"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
