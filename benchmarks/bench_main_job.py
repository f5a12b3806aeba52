"""The main job's wall time and CPU time, with and without its side-by-side capture.

    python benchmarks/bench_main_job.py [--rounds 3] [--git-base REV]

Runs `k3c compile --model k3-tiny --backend all` (the README's main job) `--rounds` times in
each variant, the variants alternating so that a host whose speed drifts (a shared machine)
moves them alike, and prints each run's wall seconds and CPU seconds (user + sys of the
command and its children) and the median of each variant:

- `default`: as a user runs it;
- `K3C_FORK=0`: the entries captured one after another in this process (k3c/forked.py);
- `--git-base REV` adds the job as it was at REV: a worktree of this repository in a temporary
  folder, its k3c imported from there with this environment's other packages (`python -S -m
  k3c.cli`, so the command's own exit, not the console entry point's, for that row).

Each round first times a fixed Python loop (0.21 s on a quiet 2-core Zen 4): the host's speed
in that minute, to read the rows beside.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
JOB = ["compile", "--model", "k3-tiny", "--backend", "all"]


def loop_seconds() -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(5_000_000):
        s += i * i
    return time.perf_counter() - t0


def timed(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def base_tree(rev: str, where: Path) -> tuple[Path, Path]:
    """(a worktree of `rev`, a folder to put on PYTHONPATH where `k3c` imports from it): k3c's
    subpackages live in top-level folders (pyproject's package-dir), so the folder holds a
    `k3c` of links to the worktree's files and folders, those of package-dir included."""
    tree = where / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                   capture_output=True)
    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    pkg = where / "path" / "k3c"
    pkg.mkdir(parents=True)
    for f in (tree / mapping["k3c"]).iterdir():
        (pkg / f.name).symlink_to(f)
    for name, folder in mapping.items():
        if name.count(".") == 1:
            (pkg / name.split(".")[1]).symlink_to(tree / folder)
    return tree, where / "path"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--git-base", help="also time the main job as it was at this revision")
    args = p.parse_args()
    k3c = [str(Path(sys.executable).with_name("k3c"))]
    env = dict(os.environ)
    variants = {"default": (k3c + JOB, env, ROOT), "K3C_FORK=0": (k3c + JOB, {**env, "K3C_FORK": "0"}, ROOT)}
    with tempfile.TemporaryDirectory(prefix="k3c-bench-main-") as tmp:
        if args.git_base:
            _, path = base_tree(args.git_base, Path(tmp))
            # -S: no site, so no .pth file puts this checkout's editable k3c ahead of REV's;
            # the packages from this environment's site-packages, on the path after REV's k3c
            packages = os.pathsep.join([str(path), *(p for p in sys.path if p.endswith("site-packages"))])
            variants[args.git_base] = ([sys.executable, "-S", "-m", "k3c.cli", *JOB],
                                       {**env, "PYTHONPATH": packages}, path)  # not the tree: its plain k3c/
        runs: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        try:
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}: python loop {loop_seconds():.3f} s", file=sys.stderr)
                for name, (cmd, e, cwd) in variants.items():
                    runs[name].append(timed(cmd, e, cwd))
                    print(f"  {name:12s} {runs[name][-1][0]:6.2f} s wall  {runs[name][-1][1]:6.2f} CPU-s",
                          file=sys.stderr)
        finally:
            if args.git_base:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                               capture_output=True)
    print(f"k3c compile --model k3-tiny --backend all, {os.cpu_count()} CPUs, {args.rounds} rounds alternating")
    print(f"{'variant':14s} {'wall s (each)':28s} {'median':>7s} {'CPU-s median':>13s}")
    for name, rs in runs.items():
        walls = " ".join(f"{w:.1f}" for w, _ in rs)
        print(f"{name:14s} {walls:28s} {statistics.median(w for w, _ in rs):7.2f} "
              f"{statistics.median(c for _, c in rs):13.2f}")


if __name__ == "__main__":
    main()
