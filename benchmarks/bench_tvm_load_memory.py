"""What a TVM artifact's runner holds after its load, with the parameters on huge pages and
where TVM's allocator put them: the resident set (VmRSS) of a fresh process before and after
`TvmRunner._start`, each way in its own process.

    python benchmarks/bench_tvm_load_memory.py DIR          # an artifact built for llvm

The arena (backends/tvm/arena.py) copies each parameter and frees the original, so the two
should hold about the same; a runner that kept the originals would hold the parameters twice.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROBE = """
import json, sys
import torch
from k3c.backends.tvm.runner import TvmRunner

def rss_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024

runner = TvmRunner(sys.argv[1])
before = rss_mb()
runner._start()
views = [torch.from_dlpack(p) for p in runner._params]
print(json.dumps({"before_mb": before, "after_mb": rss_mb(),
                  "params_mb": sum(v.numel() * v.element_size() for v in views) / 2**20}))
"""


def probe(artifact: str, huge: bool) -> dict:
    env = {**os.environ, "K3C_HUGE_PAGES": "1" if huge else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE, artifact], env=env, check=True, capture_output=True,
                         text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    args = ap.parse_args()
    print("| parameters | params MiB | RSS before load MiB | after MiB | added MiB |\n|---|---|---|---|---|")
    for huge, name in ((False, "where TVM put them"), (True, "on huge pages")):
        r = probe(args.artifact, huge)
        print(f"| {name} | {r['params_mb']:.0f} | {r['before_mb']:.0f} | {r['after_mb']:.0f} | "
              f"{r['after_mb'] - r['before_mb']:.0f} |")


if __name__ == "__main__":
    main()
