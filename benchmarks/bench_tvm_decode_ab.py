"""TVM artifacts' decode steps side by side: the Relax VM's `decode` call alone (no runner,
no input checks), in turns, from each artifact's own prefill of the same prompt.

    python benchmarks/bench_tvm_decode_ab.py --git-base REV                # k3-small as released, REV vs this tree
    python benchmarks/bench_tvm_decode_ab.py --git-base REV --batch 8 --steps 16
    python benchmarks/bench_tvm_decode_ab.py DIR1 DIR2                     # artifacts built before

`--git-base REV` builds the release artifact of --model (BF16, MXFP4 experts) with this tree
and with REV (a worktree, as bench_main_job.py makes it) and times both.

Each round runs every artifact once: a few untimed steps, then --steps steps, each from the
prompt's state with its own random token (the steps of the roofline benchmark). Prints the
milliseconds a step, every round, and the minimum and median over rounds. The artifacts
must take the same inputs (the same model). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_main_job import ROOT, base_tree  # this folder's: run as a script

from k3c.backends.tvm.runner import TvmRunner


def load(out: Path, prompt: torch.Tensor, tokens: list[torch.Tensor], batch: int):
    runner = TvmRunner(out)
    entries = json.loads((out / "manifest.json").read_text())["entries"]
    outs = runner.run("prefill", prompt)
    state = dict(zip([o["name"] for o in entries["prefill"]["outputs"]][1:], outs[1:]))
    names = [i["name"] for i in entries["decode"]["inputs"]][1:]
    rows = [state[n].repeat_interleave(batch, 0) for n in names]
    calls = [[runner._to_tvm(x), *(runner._to_tvm(r) for r in rows)] for x in tokens]
    return runner._vm["decode"], calls, runner._params


RELEASE = ["--backend", "tvm", "--dtype", "bf16", "--experts", "mxfp4", "--force"]


def build_both(rev: str, model: str, tmp: Path) -> list[Path]:
    """The release artifact of `model` built by REV's k3c and by this tree's, in `tmp`."""
    _, path = base_tree(rev, tmp)
    packages = os.pathsep.join([str(path), *(p for p in sys.path if p.endswith("site-packages"))])
    outs = [tmp / rev.replace("/", "_"), tmp / "this-tree"]
    for cmd, env, cwd, out in (([sys.executable, "-S", "-m", "k3c.cli"], {**os.environ, "PYTHONPATH": packages}, path,
                                outs[0]),
                               ([str(Path(sys.executable).with_name("k3c"))], dict(os.environ), ROOT, outs[1])):
        print(f"building {out.name} ...", flush=True)
        subprocess.run([*cmd, "compile", "--model", model, *RELEASE, "--out", str(out)], env=env, cwd=cwd,
                       check=True, capture_output=True)
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="*", type=Path)
    ap.add_argument("--git-base", help="build the release artifact with this revision and with this tree")
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens (P)")
    ap.add_argument("--vocab", type=int, default=1000, help="token ids are drawn below this")
    args = ap.parse_args()
    if not args.artifacts and not args.git_base:
        ap.error("name artifact folders or --git-base REV")
    if args.git_base:
        with tempfile.TemporaryDirectory(prefix="k3c-decode-ab-") as tmp:
            try:
                args.artifacts = build_both(args.git_base, args.model, Path(tmp)) + args.artifacts
                run(args)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                               capture_output=True)
    else:
        run(args)


def run(args) -> None:
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=gen)
    tokens = [torch.randint(0, args.vocab, (args.batch, 1), generator=gen) for _ in range(args.steps)]
    runs = {str(a): load(a, prompt, tokens, args.batch) for a in args.artifacts}
    times: dict[str, list[float]] = {a: [] for a in runs}
    for r in range(args.rounds):
        for a, (fn, calls, params) in runs.items():
            for c in calls[:4]:
                fn(*c, *params)
            t0 = time.perf_counter()
            for c in calls:
                fn(*c, *params)
            times[a].append(1e3 * (time.perf_counter() - t0) / len(calls))
        print(f"round {r + 1}/{args.rounds}: " + "  ".join(f"{t[-1]:.2f}" for t in times.values()), flush=True)
    print(f"\ndecode step, B = {args.batch}, P = {args.prompt} (ms)")
    print("| artifact | min | median |\n|---|---|---|")
    for a, t in times.items():
        print(f"| {a} | {min(t):.3f} | {statistics.median(t):.3f} |")


if __name__ == "__main__":
    main()
