"""The slots row of bench_serving.py: the decode step of --slots sequences in k3c.slots.Slots,
unfused (an artifact compiled with fuse-kda-decode{enable=false}) and with KDA's fused decode
step (kda_decode_step: the serving artifact, where its backend lowers the op), each against
the bytes floor of bench_roofline_cpu; `bench` is the bench_serving module (its helpers)."""

from __future__ import annotations

import torch

import k3c
from k3c.models.stats import model_stats
from k3c.slots import Slots

FUSED_OP = "kda_decode_step"  # KDA's fused decode step (fuse-kda-decode), where the backend lowers it
UNFUSED = [*k3c.passes.steps_of("default"), "fuse-kda-decode{enable=false}"]


def _slot_steps(args, run, model, bench) -> tuple[float, float, bool, torch.Tensor]:
    """(seconds a decode step of --slots slots, slot 0's rel RMS error against its sequence
    decoded alone, whether that is within the fp32 row, the step's logits)."""
    vocab, n = model.config.vocab_size, args.slots
    slots = Slots(run, n)
    with torch.no_grad():
        _, shared = run.prefill(bench.ids(vocab, args.prefix, 2), logits="last")
        for s in range(n):
            slots.add(bench.ids(vocab, bench.OWN, 100 + s), state=shared)
        tokens = {s: int(t) for s, t in enumerate(bench.ids(vocab, n, 7)[0])}
        alone = run.decode(torch.tensor([[tokens[0]]]), slots.state_of(0))[0][0, -1]
        logits = slots.step(tokens)  # also the warm-up
        err, ok = bench.check(logits[0], alone)

        def loop():
            for _ in range(args.steps):
                slots.step(tokens)

        bench.settle()
        seconds = bench.best_of(loop, args.repeat) / args.steps
    return seconds, err, ok, torch.stack([logits[s] for s in range(n)])


def slots_decode(args, run, model, rf, bench) -> dict:
    """The decode step of --slots slots, unfused and with KDA's fused decode step (the serving
    artifact, when its backend lowers the op: fuse-kda-decode is then in its pipeline), each
    against the bytes floor; the fused step's logits against the unfused step's."""
    n = args.slots
    fused = FUSED_OP in run.graphs["decode"].op_counts()
    unfused_run = bench.compile_fixed(model, args.backend, run.max_context, run.out_dir.parent / "serve-unfused",
                                      passes=UNFUSED) if fused else run
    assert FUSED_OP not in unfused_run.graphs["decode"].op_counts()
    seconds, err, ok, logits = _slot_steps(args, unfused_run, model, bench)
    context = args.prefix + bench.OWN + 1 + args.steps * args.repeat  # about where the timed steps ran
    state_bytes = model_stats(model, seq_len=context, dtype=torch.float32)["state_bytes"]["total"]
    nbytes = rf.decode_bytes(rf.weight_classes(model), rf.HELD["fp32"], state_bytes, n)
    bw = rf.read_bandwidth(args.bandwidth_mib, 3)
    floor = nbytes / bw

    def result(t: float) -> str:
        return f"{1e3 * t:.1f} ms, {t / floor:.2f}x floor ({100 * floor / t:.0f}% of the floor's speed)"

    table = [(f"decode, {n} slots at ~{context}", "unfused step", f"{result(seconds)}; floor {1e3 * floor:.1f} ms: "
              f"{nbytes / bench.MB:.0f} MiB at {bw / 1e9:.1f} GB/s", f"slot 0 vs alone {err:.1e}: {bench.OK[ok]}")]
    out = {"slots": n, "context": context, "seconds_per_step": seconds, "bytes_read": nbytes, "read_bytes_per_s": bw,
           "floor_seconds": floor, "multiple_of_floor": seconds / floor, "slot0_rel_rms": err, "fused": None}
    if fused:
        f_seconds, f_err, f_ok, f_logits = _slot_steps(args, run, model, bench)
        vs, vs_ok = bench.check(f_logits, logits)
        out["fused"] = {"seconds_per_step": f_seconds, "multiple_of_floor": f_seconds / floor,
                        "slot0_rel_rms": f_err, "vs_unfused_rel_rms": vs, "speedup": seconds / f_seconds,
                        "kda_layers": run.graphs["decode"].op_counts()[FUSED_OP]}
        ok = ok and f_ok and vs_ok
        table.append(("", "fused KDA step", f"{result(f_seconds)}; {seconds / f_seconds:.2f}x the unfused",
                      f"slot 0 vs alone {f_err:.1e}, vs unfused {vs:.1e}: {bench.OK[f_ok and vs_ok]}"))
    else:
        table.append(("", "fused KDA step", f"absent: {args.backend} has no kernel of its own for {FUSED_OP}", ""))
    return {**out, "ok": ok, "table": table}
