"""The Triton backend on a CUDA GPU (H100/H200 class): KDA chunked prefill against fla and the
torch chunked reference, and k3-small prefill against eager and torch.compile; first, on any
machine, the ahead-of-time report of K3's kernels and their roofline projection.

    python benchmarks/bench_triton_gpu.py [--aot] [--only kda|model] [--json FILE]
        [--T 8192] [--model-T 4096] [--peak-tflops F] [--peak-tf32-tflops F] [--peak-gbps F]
        [--target sm_90] [--aot-model k3] [--aot-layers 4] [--aot-out DIR]

0. AOT (no GPU needed; `--aot` stops after it): K3 built on the meta device, in bf16, with
   4 of its 93 layers (a dense, three KDA and an MLA layer: every kind of layer K3 has, each
   at K3's shapes; `--aot-layers 93` for all, which takes minutes to capture), compiled by
   k3c for Triton with every kernel compiled for --target (backends/triton/aot.py): the
   kernels.json summary per kernel, then a roofline per Triton op on H200 at B = 1, prefill
   T = --T and a decode step after it (backends/triton/roofline.py: FLOPs and bytes from
   passes/cost.py, peaks from the datasheet), and chunked KDA's projection beside fla's
   measured chunk_kda. A projection, labelled as one.

1. KDA forward, bf16 inputs, B = 1, T = 8192, H = 16, K = V = 128 (fp32 state): k3c's three
   Triton pieces (and each piece alone), fla's `chunk_kda`, k3c's torch chunked reference.
   Achieved TFLOP/s and GB/s use one work model for every implementation (the FLOPs of the
   chunked algorithm, the bytes of reading q, k, v, g, beta once and writing o once) and are
   set against the GPU's peak (a table of datasheet figures, or the --peak-* flags).
2. k3-small prefill, T = 4096, B = 1: eager, torch.compile (compile time apart) and the model
   compiled by k3c for Triton; the logits of each are checked against eager.

Timing: triton.testing.do_bench (CUDA events, warm-up, median). Nothing is asserted; the
target is k3c within 1.25x of fla's chunk_kda, and ahead of torch.compile end to end.
Run on an otherwise idle GPU; record the printed tables in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

# datasheet peaks (dense): bf16 tensor-core TFLOP/s, tf32 TFLOP/s, HBM GB/s
PEAKS = {"H200": (989.0, 494.7, 4800.0), "H100 SXM": (989.0, 494.7, 3350.0), "H100 PCIe": (756.0, 378.0, 2000.0),
         "H100": (989.0, 494.7, 3350.0), "A100": (312.0, 156.0, 2039.0)}


def peaks(args) -> tuple[float, float, float, str]:
    name = torch.cuda.get_device_name()
    found = next(((k, v) for k, v in PEAKS.items() if k.replace(" ", "").lower() in name.replace(" ", "").lower()),
                 (None, (float("nan"),) * 3))
    bf16, tf32, gbps = found[1]
    bf16 = args.peak_tflops or bf16
    tf32 = args.peak_tf32_tflops or tf32
    gbps = args.peak_gbps or gbps
    return bf16, tf32, gbps, name


def bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200))


def kda_work(B: int, T: int, H: int, K: int, V: int, C: int = 64) -> tuple[float, float]:
    """(FLOPs, bytes) of chunked KDA forward from passes/cost.py: the FLOPs of its three chunked
    pieces, the bytes of the `kda` op (bf16 q, k, v, fp32 g, beta and state read once, o and
    the state written once), the traffic a fully fused kernel would have."""
    from k3c.ir import TensorType
    from k3c.passes.cost import chunk_delta_cost, op_cost

    flops = sum(c.flops for c in chunk_delta_cost(B, T, H, K, V, "bf16", C).values())
    qk, v, g = TensorType("bf16", (B, T, H, K)), TensorType("bf16", (B, T, H, V)), TensorType("f32", (B, T, H, K))
    kda, _ = op_cost("kda", [qk, qk, v, g, TensorType("f32", (B, T, H)), TensorType("f32", (B, H, K, V))],
                     {"scale": K**-0.5})
    return float(flops), float(kda.bytes)


# fla's chunk_kda measured elsewhere (bf16, K = V = 128, B = 1): (GPU, T, H, ms, where)
FLA_ANCHORS = [("H100 SXM", 8192, 16, 0.933, "fla chunk_kda, NVIDIA/cudnn-frontend#1017"),
               ("H800", 8192, 96, 3.176, "fla chunk_kda, fla-org/flash-linear-attention#915"),
               ("H800", 8192, 96, 1.986, "fla fused inference kernels (BT = 16), same PR")]
CHUNK_OPS = ("chunk_prepare", "chunk_state_scan", "chunk_output")


def aot_report(args) -> dict:
    """0. K3's kernels compiled for args.target without a GPU, and their roofline on H200."""
    import tempfile

    import k3c
    from k3c.backends.triton.aot import load_report
    from k3c.backends.triton.roofline import H200, markdown, roofline

    n = args.aot_layers
    overrides = {} if args.aot_model != "k3" or n == 93 else {
        "num_layers": n, "mla_layers": tuple(sorted(set(range(4, n + 1, 4)) | {n}))}
    model = k3c.models.build(args.aot_model, dtype=torch.bfloat16, device="meta", **overrides)
    out = args.aot_out or tempfile.mkdtemp(prefix="k3c-aot-")
    t0 = time.perf_counter()
    k3c.compile(model, "triton", (torch.zeros(1, 16, dtype=torch.long, device="meta"),), out_dir=out,
                target=args.target, seq_len=args.T)
    seconds = time.perf_counter() - t0
    report = load_report(out)
    print(f"\n{args.aot_model} ({n} layers), bf16: every Triton kernel compiled for {args.target} "
          f"(capture, passes and compile {seconds:.0f} s) into {out}")
    print(report.table())
    for line in report.problems():
        print(f"  {line}")
    rows = roofline(out, {"B": 1, "T": args.T, "P": args.T})
    print(f"\nRoofline projection on {H200.name} (not a measurement), B=1, prefill T={args.T}, decode after it:")
    print(markdown(rows, H200))

    anchors = kda_anchors(out)
    return {"summary": report.summary(), "roofline": [r.__dict__ | {"seconds_h200": r.seconds(H200)} for r in rows],
            "kda_anchors": anchors}


def kda_anchors(out: str) -> list[dict]:
    """k3c's three chunked-KDA pieces of one layer (as the artifact's prefill graph has them, at
    T = 8192, each with its kernels' dot kind) projected beside fla's measured chunk_kda. Every
    term of the pieces' cost has a factor H, so other head counts scale the layer's cost."""
    from k3c.backends.triton.roofline import H100, H200, roofline

    kda = {r.op: r for r in roofline(out, {"B": 1, "T": 8192, "P": 8192})
           if r.entry == "prefill" and r.op in CHUNK_OPS}
    if set(kda) != set(CHUNK_OPS):
        print("(no chunked KDA in this model)")
        return []
    heads = int(kda["chunk_prepare"].shape.split("x")[2])
    print(f"\nChunked KDA forward, one layer, B=1 T=8192 K=V=128, as in {heads}-head K3 (dots: "
          f"{', '.join(f'{op} {r.dot}' for op, r in kda.items())}): roofline of k3c's pieces beside fla's measured")
    print("| GPU | H | fla measured ms | source | k3c projected ms (a + b + c) | k3c GB moved |")
    print("|---|---|---|---|---|---|")
    anchors = []
    for gpu, T, H, ms, source in FLA_ANCHORS + [("H200", 8192, heads, None, "-")]:
        peaks = H200 if gpu == "H200" else H100  # the H800's compute and memory peaks are the H100 SXM's
        proj = sum(r.seconds(peaks) for r in kda.values()) * H / heads
        gb = sum(r.bytes for r in kda.values()) * H / heads / 1e9
        print(f"| {gpu} | {H} | {ms if ms else '-'} | {source} | {proj * 1e3:.3f} | {gb:.2f} |")
        anchors.append({"gpu": gpu, "T": T, "H": H, "fla_ms": ms, "source": source, "k3c_projected_ms": proj * 1e3,
                        "k3c_gbytes": gb})
    return anchors
def kda_inputs(B, T, H, K, V, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)
    q, k = F.normalize(r(B, T, H, K), dim=-1), F.normalize(r(B, T, H, K), dim=-1)
    gate = -5.0 * torch.sigmoid(r(B, T, H, K))
    beta = torch.sigmoid(r(B, T, H))
    return tuple(x.to(torch.bfloat16) for x in (q, k, r(B, T, H, V), gate, beta))


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def bench_kda(args) -> dict:
    from k3c.kernels.delta.triton import chunk_kda, chunk_output, chunk_prepare, chunk_state_scan
    from k3c.kernels.kda.chunk import chunk_kda as torch_chunk_kda

    B, T, H, K, V = 1, args.T, 16, 128, 128
    scale = K**-0.5
    q, k, v, g, beta = kda_inputs(B, T, H, K, V)
    flops, nbytes = kda_work(B, T, H, K, V)
    bf16_peak, tf32_peak, gbps_peak, device = peaks(args)
    rows, outputs = {}, {}

    torch.set_float32_matmul_precision("high")  # tf32 dots inside k3c's fp32 chunk pieces
    run_k3c = lambda: chunk_kda(q, k, v, g, beta, scale=scale)
    outputs["k3c triton"] = run_k3c()
    rows["k3c triton"] = bench_ms(run_k3c)
    pieces = chunk_prepare(q, k, v, beta, g, 64, "channel")
    q_dec, k_dec, w, u, aqk, decay = pieces
    scanned = chunk_state_scan(w, u, k_dec, decay, None)
    rows["  (a) chunk_prepare"] = bench_ms(lambda: chunk_prepare(q, k, v, beta, g, 64, "channel"))
    rows["  (b) chunk_state_scan"] = bench_ms(lambda: chunk_state_scan(w, u, k_dec, decay, None))
    rows["  (c) chunk_output"] = bench_ms(lambda: chunk_output(q_dec, aqk, scanned[0], scanned[1], scale, T,
                                                               torch.bfloat16))
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda

        run_fla = lambda: fla_chunk_kda(q, k, v, g, beta, scale=scale, output_final_state=True)
        outputs["fla chunk_kda"] = run_fla()
        rows["fla chunk_kda"] = bench_ms(run_fla)
    except Exception as e:  # fla missing or its kernels unsupported here: report, go on
        print(f"fla chunk_kda unavailable: {type(e).__name__}: {e}", file=sys.stderr)
    torch.set_float32_matmul_precision("highest")
    run_torch = lambda: torch_chunk_kda(q.float(), k.float(), v.float(), g.float(), beta.float(), scale=scale)
    outputs["torch chunked reference"] = run_torch()
    rows["torch chunked reference"] = bench_ms(run_torch)

    o_ref, S_ref = outputs["torch chunked reference"]
    print(f"\nKDA chunked prefill forward, bf16 inputs, B={B} T={T} H={H} K={K} V={V} on {device}")
    print(f"work model: {flops / 1e9:.1f} GFLOP, {nbytes / 1e6:.0f} MB; peaks: {bf16_peak} bf16 / {tf32_peak} tf32 "
          f"TFLOP/s, {gbps_peak} GB/s")
    print("| implementation | ms | TFLOP/s | % bf16 peak | % tf32 peak | GB/s | % HBM peak | vs fla "
          "| o rel rms vs torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    fla_ms = rows.get("fla chunk_kda")
    result = {"device": device, "shape": dict(B=B, T=T, H=H, K=K, V=V), "gflop": flops / 1e9,
              "mbytes": nbytes / 1e6, "rows": {}}
    for name, ms in rows.items():
        tflops, gbps = flops / ms / 1e9, nbytes / ms / 1e6
        if name.startswith("  "):  # one piece of k3c's: time only
            print(f"| {name} | {ms:.3f} | | | | | | | |")
            result["rows"][name.strip()] = {"ms": ms}
            continue
        err = rel_rms(outputs[name][0].float(), o_ref)
        ratio = f"{ms / fla_ms:.2f}x" if fla_ms else "-"
        print(f"| {name} | {ms:.3f} | {tflops:.1f} | {100 * tflops / bf16_peak:.1f} | {100 * tflops / tf32_peak:.1f} | "
              f"{gbps:.0f} | {100 * gbps / gbps_peak:.1f} | {ratio} | {err:.1e} |")
        result["rows"][name] = {"ms": ms, "tflops": tflops, "gbps": gbps, "o_rel_rms_vs_torch": err}
    return result


def bench_model(args) -> dict:
    import k3c

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.model_dtype]
    torch.set_float32_matmul_precision("high")
    model = k3c.models.build("k3-small").to("cuda", dtype).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.model_T), generator=torch.Generator().manual_seed(0))
    ids = ids.cuda()
    rows, compile_s = {}, {}
    with torch.no_grad():
        ref = model.prefill(ids)[0].float()
        rows["eager"] = bench_ms(lambda: model.prefill(ids))
        t0 = time.perf_counter()
        compiled_tc = torch.compile(model.prefill)
        out_tc = compiled_tc(ids)[0].float()
        compile_s["torch.compile"] = time.perf_counter() - t0
        rows["torch.compile"] = bench_ms(lambda: compiled_tc(ids))
        t0 = time.perf_counter()
        compiled = k3c.compile(model, "triton", (ids[:, :64],))
        out_k3c = compiled.prefill(ids)[0].float()
        compile_s["k3c triton"] = time.perf_counter() - t0
        rows["k3c triton"] = bench_ms(lambda: compiled.prefill(ids))
    errs = {"eager": 0.0, "torch.compile": rel_rms(out_tc, ref), "k3c triton": rel_rms(out_k3c, ref)}
    print(f"\nk3-small prefill, {args.model_dtype}, B=1 T={args.model_T} on {torch.cuda.get_device_name()}")
    print("| runner | ms | vs eager | vs torch.compile | compile s | logits rel rms vs eager |")
    print("|---|---|---|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.2f} | {rows['eager'] / ms:.2f}x | {rows['torch.compile'] / ms:.2f}x | "
              f"{compile_s.get(name, 0.0):.1f} | {errs[name]:.1e} |")
    return {"model": "k3-small", "T": args.model_T, "dtype": args.model_dtype,
            "rows": {n: {"ms": ms, "compile_s": compile_s.get(n), "logits_rel_rms_vs_eager": errs[n]}
                     for n, ms in rows.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aot", action="store_true", help="only the AOT report and roofline (no GPU needed)")
    p.add_argument("--target", default="sm_90", help="GPU target of the AOT report (sm_80, sm_90, sm_100)")
    p.add_argument("--aot-model", default="k3", help="model of the AOT report (default k3)")
    p.add_argument("--aot-layers", type=int, default=4, help="k3's layers in the AOT report (default 4; 93: all)")
    p.add_argument("--aot-out", help="folder for the AOT artifact (default: temporary)")
    p.add_argument("--only", choices=["kda", "model"])
    p.add_argument("--T", type=int, default=8192, help="KDA length (default 8192)")
    p.add_argument("--model-T", type=int, default=4096, help="k3-small prefill length (default 4096)")
    p.add_argument("--model-dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--peak-tflops", type=float, help="bf16 dense peak of this GPU (default: datasheet table)")
    p.add_argument("--peak-tf32-tflops", type=float, help="tf32 dense peak of this GPU")
    p.add_argument("--peak-gbps", type=float, help="memory bandwidth peak of this GPU")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    out = {"aot": aot_report(args)}
    if args.aot:
        return _write(args, out)
    if not torch.cuda.is_available():
        print("bench_triton_gpu: needs a CUDA GPU for the timings (the Triton kernels run compiled there); "
              "--aot for the report alone", file=sys.stderr)
        _write(args, out)
        return 2
    if args.only in (None, "kda"):
        out["kda"] = bench_kda(args)
    if args.only in (None, "model"):
        out["k3_small"] = bench_model(args)
    return _write(args, out)


def _write(args, out: dict) -> int:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
