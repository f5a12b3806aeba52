"""One process vs a mesh of two (tp=2, ep=2 with each combine, dp=2 x ep=2, pp=2): prefill of T
tokens and N decode steps of k3-small, every configuration spawned the same way
(k3c.distributed.spawn, gloo on CPU, one thread per rank), side by side in one run.

    python benchmarks/bench_mesh.py                              # k3-small, T = 1024, 64 steps, onnx
    python benchmarks/bench_mesh.py --meshes "tp=1;dp=2,ep=2;pp=2" --batch 2
    python benchmarks/bench_mesh.py --tiny                       # k3-tiny, T = 16, 4 steps, reference: a check

Per configuration: the seconds of prefill and of the decode loop on rank 0 (no warm-up: the
first call of each segment pays its session's start-up, alike in every configuration), the
share of each spent in collectives and, with pp, in the stages' point-to-point handover
(both include waiting for the slower rank), the bytes rank 0 sent, and the bytes `k3c plan`
predicts for the same model, mesh and lengths (exact for the all-reduces and the handover;
for the all-to-all exchange, its expectation at balanced routing). With dp rank 0 runs its
copy's rows (batch / dp), with pp the prefill goes in min(batch, pp) micro-batches and rank 0
is the first stage. The logits of each run are compared with the eager model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

from k3c import models
from k3c.distributed.diff import compare_mesh
from k3c.distributed.mesh import Mesh
from k3c.distributed.runner import compile_mesh
from k3c.distributed.spawn import spawn
from k3c.plan import plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--backend", default="onnx")
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--meshes", default="tp=1;tp=2;ep=2;ep=2@all_to_all",
                    help="';'-separated meshes, each optionally @combine (auto, all_reduce, all_to_all)")
    ap.add_argument("--batch", type=int, default=1, help="sequences (dp=2 needs 2)")
    ap.add_argument("--tiny", action="store_true", help="k3-tiny, T = 16, 4 steps, reference, every mesh kind")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.tiny:
        args.model, args.backend, args.prefill, args.decode, args.batch = "k3-tiny", "reference", 16, 4, 2
        args.meshes = "tp=1;dp=2,ep=2;pp=2"
    model = models.build(args.model).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prefill + args.decode), generator=g)
    job = {"input_ids": ids[:, :args.prefill], "decode_ids": ids[:, args.prefill:]}
    rows = []
    root = Path(tempfile.mkdtemp(prefix="k3c-bench-mesh-"))
    for text in args.meshes.split(";"):
        spec, _, combine = text.partition("@")
        mesh, combine = Mesh.parse(spec), combine or "auto"
        d = compile_mesh(model, args.backend, (job["input_ids"][:, :16],), mesh,
                         root / text.replace(",", "_").replace("@", "_"), combine=combine)
        run = {**job, "micro_batches": min(args.batch, mesh.pp)}
        res = spawn(d, run, mesh.world, timeout_s=3600)
        check = compare_mesh(model, res, run, mesh)
        t = res[0]["timings"]
        coll = [sum(t[f"{phase}_parts"].get(k, 0.0) for k in ("collectives", "pipeline"))
                for phase in ("prefill", "decode")]
        rows0 = args.batch // mesh.dp  # the sequences of rank 0's copy
        p = plan(args.model, mesh, args.prefill, model=model, combine=combine,
                 batch=rows0) if mesh.world > 1 else None
        per = None if p is None else (p["per_stage"][0], p["per_stage"][0]) if "per_stage" in p else \
            (p["per_token"]["prefill"], p["per_token"]["decode"])
        predicted = 0.0 if per is None else rows0 * (
            sum(v["bytes"] * args.prefill for v in per[0].values()) + sum(v["bytes"] * args.decode
                                                                           for v in per[1].values()))
        name = str(mesh) + (f" ({combine})" if combine != "auto" else "")
        row = {"mesh": name, "ranks": mesh.world, "prefill_s": t["prefill"], "decode_s": t["decode"],
               "prefill_collective_share": coll[0] / t["prefill"], "decode_collective_share": coll[1] / t["decode"],
               "bytes_sent": sum(res[0]["sent"].values()), "bytes_planned": predicted,
               "collectives": res[0]["calls"], "ok": check["ok"],
               "max_abs_err": max(check[k]["max_abs_err"] for k in ("prefill", "decode", "state"))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{args.model} {args.backend}, {args.batch} sequence(s), T = {args.prefill}, {args.decode} decode steps, "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), one thread per rank")
    print("| mesh | ranks | prefill s | in collectives | decode s | in collectives | bytes sent (rank 0) "
          "| bytes planned | max abs err vs eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mesh']} | {r['ranks']} | {r['prefill_s']:.2f} | {100 * r['prefill_collective_share']:.1f}% "
              f"| {r['decode_s']:.2f} | {100 * r['decode_collective_share']:.1f}% | {r['bytes_sent'] / 1e6:.2f} MB "
              f"| {r['bytes_planned'] / 1e6:.2f} MB | {r['max_abs_err']:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
