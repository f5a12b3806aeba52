"""`k3c plan` over many meshes, as one markdown table (meta device, release dtypes): per rank
the bytes of weights and of state at T, the bytes sent per token by each collective, the
routed experts' combine priced both ways and what the partition runs, and the smallest mesh
whose per-rank bytes fit a device.

    python benchmarks/plan_table.py                       # k3 on 16 to 128 ranks, T = 4096, 141 GB
    python benchmarks/plan_table.py --model kimi-linear --meshes "tp=2;tp=4;tp=2,ep=4"
"""

from __future__ import annotations

import argparse
import sys

from k3c.plan import _release, plan

MESHES = ("tp=8,ep=2;tp=4,ep=4;tp=2,ep=8;tp=1,ep=16;tp=8,ep=4;tp=4,ep=8;tp=1,ep=32;"
          "tp=8,ep=8;tp=4,ep=16;tp=2,ep=32;tp=1,ep=64;tp=8,ep=16;tp=4,ep=32;tp=2,ep=64;tp=1,ep=128")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="k3")
    ap.add_argument("--meshes", default=MESHES, help="';'-separated meshes")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--device-gb", type=float, default=141.0, help="bytes one device holds (H200: 141 GB)")
    args = ap.parse_args()
    model = _release(args.model, None)
    rows, fits = [], []
    meshes = args.meshes.split(";")
    for i, mesh in enumerate(meshes):
        print(f"[{i + 1}/{len(meshes)}] {mesh}", file=sys.stderr)
        p = plan(args.model, mesh, args.seq_len, model=model)
        r, c = p["ranks"][0], p["moe_combine"]
        total = (r["weight_bytes"] + r["state_bytes"]) / 1e9
        sent = " + ".join(f"{op} {v['bytes'] / 1e6:.2f}" for op, v in sorted(p["per_token"]["decode"].items()))
        rows.append(f"| {mesh.replace(',', ', ')} | {p['mesh']['world']} | {r['weight_bytes'] / 1e9:.1f} GB | "
                    f"{r['state_bytes'] / 1e9:.3f} GB | {total:.1f} GB | {sent} MB | "
                    f"{c['all_reduce_bytes_per_token'] / 1e6:.2f} vs {c['all_to_all_bytes_per_token'] / 1e6:.2f} MB"
                    f" | {c['run'].replace('_', '-')} |")
        if total <= args.device_gb:
            fits.append((p["mesh"]["world"], total, mesh))
    print(f"{args.model}, state at T = {args.seq_len}, B = 1; sent: bytes one rank sends per decoded token\n")
    print("| mesh | ranks | weights / rank | state / rank | total / rank | sent per token (decode) | "
          "MoE combine: all-reduce vs all-to-all | run |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if fits:
        world, total, mesh = min(fits)
        print(f"\nsmallest mesh here that fits {args.device_gb:.0f} GB a rank: {mesh} ({world} ranks, {total:.1f} GB)")


if __name__ == "__main__":
    main()
