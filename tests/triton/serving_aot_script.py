"""Records and compiles the Triton serving kernels at K3's shapes and a 1M-row cache for one GPU
target (run by test_triton_serving_aot.py with TRITON_INTERPRET=0; no GPU needed):

    python serving_aot_script.py OUT_DIR sm_90 [--record-only]

prints one JSON row a kernel: kernels.json's fields (aot_build.build), the largest grid
launched, and the TTIR's int32 multiplications of two values known only at run time
(`i32_products`): an index times a stride, which is where an offset passes 2^31 at a 1M-row
cache (a multiple of a constant block, such as a program id times BC, stays bounded)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from k3c.backends.triton.aot import target
from k3c.backends.triton.aot_record import Recorder
from k3c.kernels.attention.triton import causal_attention_cached
from k3c.kernels.cache.triton import cache_write
from k3c.kernels.mla.triton import mla_attention_absorbed_cached

import triton  # isort: skip
import triton.language as tl  # isort: skip

CONTEXT = 1 << 20  # a 1M-token cache
# K3 (K3-SPEC.md section 7): MLA 96 heads, nope 128, rope 64, v 128, kv_lora 512
H, DN, DR, DV, DC = 96, 128, 64, 128, 512
# a GPT-2-like cache for causal_attention_cached (K3 has none): 12 heads of 64; and grouped heads
GPT2 = (12, 12, 64)
GQA = (32, 8, 128)
MULI = re.compile(r"arith\.muli (%[\w.]+), (%[\w.]+) : (?:i32|tensor<[0-9x]+xi32>)")
CONST = re.compile(r"(%[\w.]+) = arith\.constant")


@triton.jit
def int32_offsets(x, y, pos, stride):  # what the check must catch: row * stride in int32
    row = tl.load(pos).to(tl.int32)
    tl.store(y + row * stride, tl.load(x + row * stride))


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def launches(rec: Recorder) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        for B, T in ((1, 1), (64, 1), (1, 4096)):  # a decode step (splits), a batch of them, an extend
            rec.case = f"mla {dtype} B={B} T={T}"
            pos = meta(B, dtype=torch.int64)
            mla_attention_absorbed_cached(meta(B, T, H, DN + DR, dtype=dtype), meta(B, CONTEXT, DC, dtype=dtype),
                                          meta(B, CONTEXT, DR, dtype=dtype), meta(H, DN, DC, dtype=dtype),
                                          meta(H, DV, DC, dtype=dtype), pos, 192 ** -0.5)
        for h, g, d in (GPT2, GQA):
            for B, T in ((1, 1), (8, 512)):
                rec.case = f"causal {dtype} H={h} G={g} B={B} T={T}"
                causal_attention_cached(meta(B, T, h, d, dtype=dtype), meta(B, CONTEXT, g, d, dtype=dtype),
                                        meta(B, CONTEXT, g, d, dtype=dtype), meta(B, dtype=torch.int64), d ** -0.5)
    for B, T in ((64, 1), (1, CONTEXT)):  # a decode step's rows; a whole 1M prefill's
        rec.case = f"cache_write B={B} T={T}"
        pos = meta(B, dtype=torch.int64)
        cache_write(meta(B, CONTEXT, DC), meta(B, T, DC), pos, check=False)
        cache_write(meta(B, CONTEXT, DR), meta(B, T, DR), pos, check=False)
    rec.case = "int32_offsets"
    int32_offsets[(1,)](meta(8), meta(8), meta(1, dtype=torch.int64), 4096)


def main() -> None:
    out, tgt = Path(sys.argv[1]), target(sys.argv[2])
    rec = Recorder(tgt.gpu_target())
    with rec.intercepting(), torch.no_grad():
        launches(rec)
    rows = []
    if "--record-only" in sys.argv:
        rows = [{"name": k.name, "constexprs": k.named_constexprs(), "grid": k.grid, "cases": k.cases}
                for k in rec.launches.values()]
    else:
        from triton import knobs

        from k3c.backends.triton.aot_build import build

        (out / tgt.name).mkdir(parents=True, exist_ok=True)
        for launch in rec.launches.values():
            row = build(launch, tgt, out / tgt.name)
            if row["ok"]:  # triton's cache holds it now: its TTIR, for the pointer offsets
                with knobs.compilation.scope():
                    ttir = triton.compile(launch.source(), target=tgt.gpu_target(),
                                          options=launch.options.__dict__).asm["ttir"]
                consts = set(CONST.findall(ttir))
                row["i32_products"] = [f"{a} * {b}" for a, b in MULI.findall(ttir)
                                       if a not in consts and b not in consts]
            rows.append(row)
    print(json.dumps(rows, default=str))


if __name__ == "__main__":
    main()
