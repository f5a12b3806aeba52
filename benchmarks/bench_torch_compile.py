"""The torch.compile anchor in its dynamic and static modes beside eager, in one run: compile
time, recompiles, prefill and decode-loop seconds (the growing-cache form `k3c bench` times).

    python benchmarks/bench_torch_compile.py                       # k3-tiny, T = 256, 8 decode steps
    python benchmarks/bench_torch_compile.py --model k3-small --seq-len 1024

Per mode: `torch.compile(model.prefill / model.decode, dynamic=True | False)`; the first prefill
call and the first decode loop include their compiles (reported apart, with the number of graphs
dynamo compiled), then the fastest of `--repeat` prefills and of `--repeat` decode loops from one
prefilled state. A decode step of the growing form changes the cache length P, so in static
mode every new P is a new compile: the decode loop repeats the same positions, which is the
static mode's best case, and its first-loop time is what a generation of new tokens would see.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import k3c
from k3c.bench import best_of


def graphs_compiled() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@torch.no_grad()
def measure(prefill, decode, prompt, steps, repeat: int) -> dict:
    g0, t0 = graphs_compiled(), time.perf_counter()
    _, state = prefill(prompt)
    first_prefill = time.perf_counter() - t0

    def loop():
        st = state
        for s in steps:
            _, st = decode(s, st)

    g1, t0 = graphs_compiled(), time.perf_counter()
    loop()
    first_loop = time.perf_counter() - t0
    g2 = graphs_compiled()
    return {"first_prefill_s": first_prefill, "prefill_graphs": g1 - g0, "first_decode_loop_s": first_loop,
            "decode_graphs": g2 - g1, "prefill_s": best_of(lambda: prefill(prompt), repeat),
            "decode_loop_s": best_of(loop, repeat), "graphs_after_warmup": graphs_compiled() - g2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="k3-tiny")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="dynamic,static")
    ap.add_argument("--json")
    args = ap.parse_args()
    model = k3c.models.build(args.model).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq_len + args.decode_steps),
                        generator=torch.Generator().manual_seed(0))
    prompt = ids[:, :args.seq_len]
    steps = [ids[:, args.seq_len + i:args.seq_len + i + 1] for i in range(args.decode_steps)]
    report = {"model": args.model, "seq_len": args.seq_len, "decode_steps": args.decode_steps,
              "eager": measure(model.prefill, model.decode, prompt, steps, args.repeat)}
    print("eager", report["eager"], flush=True)
    for mode in args.modes.split(","):
        torch._dynamo.reset()
        dynamic = {"dynamic": True, "static": False}[mode]
        report[mode] = measure(torch.compile(model.prefill, dynamic=dynamic),
                               torch.compile(model.decode, dynamic=dynamic), prompt, steps, args.repeat)
        print(mode, report[mode], flush=True)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
