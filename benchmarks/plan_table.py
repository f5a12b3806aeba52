"""`k3c plan` over many meshes, as one markdown table (meta device, release dtypes): per rank
the bytes of weights and of state at T, the bytes sent per token by each collective, the
routed experts' combine priced both ways and what the partition runs, and the smallest mesh
whose per-rank bytes fit a device.

    python benchmarks/plan_table.py                       # k3 on 16 to 128 ranks, T = 4096, 141 GB
    python benchmarks/plan_table.py --model kimi-linear --meshes "tp=2;tp=4;tp=2,ep=4"
    python benchmarks/plan_table.py --anchors             # K3's published deployments beside the estimate

`--anchors`: the device table (k3c/plan_devices.py), then each published K3 deployment of
ANCHORS.md with the plan's roofline estimate beside the published figure and the ratio
(estimate / published: an upper bound must not come out below 1).
"""

from __future__ import annotations

import argparse
import sys

from k3c.plan import _release, plan
from k3c.plan_devices import device, device_table
from k3c.plan_mesh import DeployMesh
from k3c.plan_model import profile
from k3c.plan_roofline import estimate

# (what, mesh in k3c's axes, device, concurrency, context, published figure, which figure)
ANCHORS = (
    ("TensorRT-LLM DEP16, 8K in / 1K out", "dp=16,ep=16", "gb300", 256, 9216, 239.0, "gpu"),
    ("TensorRT-LLM TEP16, 8K in / 1K out", "tp=16", "gb300", 4, 9216, 55.0, "user"),
    ("vLLM TP8, one user", "tp=8", "gb300", 1, 9216, 111.0, "user"),
    ("vLLM TP16, one user", "tp=16", "gb300", 1, 9216, 118.0, "user"),
    ("8 x H200 (does not fit)", "tp=8", "h200", 1, 9216, None, "user"),
    ("16 x H200, TP16", "tp=16", "h200", 16, 9216, None, "gpu"),
    ("16 x H200, TP8 x EP2", "tp=8,ep=2", "h200", 16, 9216, None, "gpu"),
    ("16 x H200, DEP16", "dp=16,ep=16", "h200", 16, 9216, None, "gpu"),
    ("8 x B300, TP8", "tp=8", "b300", 16, 9216, None, "gpu"),
)


def anchors(model_name: str, state_dtype: str | None) -> None:
    prof = profile(_release(model_name, None), model_name)
    item = 2 if state_dtype == "bf16" else None
    print(device_table())
    print(f"\n{model_name}, recurrent state {state_dtype or 'f32'}; decode estimates at the published concurrency\n")
    print("| deployment | mesh | GPUs | device | N | context | weights / GPU | state / GPU | fits | max N | "
          "decode tok/s per GPU | per user | prefill tok/s per GPU | published | estimate / published | step bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for what, mesh, dev, n, ctx, pub, kind in ANCHORS:
        m = DeployMesh.parse(mesh)
        e = estimate(prof, m, device(dev), n, ctx, state_item=item)
        st = e["memory"]["stages"][0]
        mine = e["decode_tokens_per_s_per_gpu"] if kind == "gpu" else e["decode_tokens_per_s_per_user"]
        ratio = f"{mine / pub:.2f}x" if pub else ""
        if kind == "gpu" and "8K in / 1K out" in what:  # each output token also costs 8 prompt tokens of prefill
            both = 1 / (1 / mine + 8 / e["prefill_tokens_per_s_per_gpu"])
            ratio += f"; {both:.1f} tok/s with the prompts' prefill: {both / pub:.2f}x"
        pubs = f"{pub:g} per {kind.upper() if kind == 'gpu' else kind}" if pub else "none"
        step = e["decode_step"]
        bound = f"{step['bound']} ({step['hbm_s'] * 1e3:.2f} ms HBM, {step['link_s'] * 1e3:.2f} ms link)"
        print(f"| {what} | {mesh} | {m.world} | {dev} | {n} | {ctx} | {st['weight_bytes'] / 1e9:.1f} GB | "
              f"{st['state_bytes'] / 1e9:.2f} GB | {'yes' if e['fits'] else 'no'} | {e['max_concurrency']} | "
              f"{e['decode_tokens_per_s_per_gpu']:.1f} | {e['decode_tokens_per_s_per_user']:.1f} | "
              f"{e['prefill_tokens_per_s_per_gpu']:.0f} | {pubs} | {ratio} | {bound} |")

MESHES = ("tp=8,ep=2;tp=4,ep=4;tp=2,ep=8;tp=1,ep=16;tp=8,ep=4;tp=4,ep=8;tp=1,ep=32;"
          "tp=8,ep=8;tp=4,ep=16;tp=2,ep=32;tp=1,ep=64;tp=8,ep=16;tp=4,ep=32;tp=2,ep=64;tp=1,ep=128")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="k3")
    ap.add_argument("--meshes", default=MESHES, help="';'-separated meshes")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--device-gb", type=float, default=141.0, help="bytes one device holds (H200: 141 GB)")
    ap.add_argument("--anchors", action="store_true", help="the published K3 deployments beside the estimate")
    ap.add_argument("--state-dtype", choices=("f32", "bf16"), default=None)
    args = ap.parse_args()
    if args.anchors:
        return anchors(args.model, args.state_dtype)
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
