"""What onnxruntime holds after loading a release-precision ONNX artifact, against the release bytes.

    python benchmarks/bench_onnx_memory.py [--model k3-small] [--entry decode]

Builds the model in its release precision (BF16, MXFP4 experts for K3), compiles it to both
ONNX flavours, and opens one InferenceSession of `--entry` in a fresh process per flavour:
the growth of that process's resident set (VmRSS) across the session's creation is what
onnxruntime holds for the weights (plus its own arenas), set beside the weights' stored bytes
(k3c.models.weight_bytes). onnxruntime folds every weight-only subgraph at session creation
(the BF16 -> float32 casts before its GEMMs, the portable flavour's in-graph MXFP4 decode), so
what it holds is mostly those float32 copies; the table also counts the BF16 weights each
graph widens with a Cast, and for a BF16 model the form built for the CUDA provider under
`compute="bf16"` (lowered only: no GPU needed). Linux only (reads /proc/self/status).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

PROBE = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from k3c.backends.onnx.runner import OnnxRunner
runner = OnnxRunner(sys.argv[1])
before = rss()
runner.session(sys.argv[2])
print("RESULT " + json.dumps({"held": rss() - before}))
"""


def session_bytes(artifact: Path, entry: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, str(artifact), entry], capture_output=True, text=True,
                         timeout=600, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])["held"]


def widened_bytes(artifact: Path, entry: str) -> int:
    """The float32 bytes of the BF16 initializers that a Cast of the entry's graph widens (what
    onnxruntime folds into float32 copies at session creation)."""
    import math

    import onnx

    proto = onnx.load(artifact / f"{entry}.onnx", load_external_data=False)
    bf16 = {t.name: math.prod(t.dims) for t in proto.graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16}
    return sum(4 * bf16[n.input[0]] for n in proto.graph.node if n.op_type == "Cast" and n.input[0] in bf16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="k3-small")
    ap.add_argument("--entry", default="decode", choices=["prefill", "decode"])
    args = ap.parse_args()
    from k3c import models
    from k3c.backends.onnx import OnnxBackend
    from k3c.compiler import capture_entries, prepare
    from k3c.models.precision import release_precision
    from k3c.models.weight_bytes import weight_bytes

    print(f"building {args.model} in its release precision", file=sys.stderr, flush=True)
    model = models.build(args.model, **release_precision(models.build(args.model, device="meta").config))
    release = weight_bytes(model)["total"]
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    graphs = capture_entries(model, (ids,), entries=("prefill", "decode"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="k3c-onnx-memory-") as tmp:
        for flavour in ("portable", "ort"):
            print(f"onnx:{flavour}: compiling and opening the {args.entry} session", file=sys.stderr, flush=True)
            be = OnnxBackend(flavour=flavour)
            out = be.lower(prepare(graphs, be), Path(tmp) / flavour)
            rows.append((f"onnx:{flavour}", widened_bytes(out, args.entry), session_bytes(out, args.entry)))
        if release_precision(model.config)["dtype"] == torch.bfloat16:  # the CUDA form: lowered, not opened
            print("onnx --target cuda --compute bf16: compiling", file=sys.stderr, flush=True)
            be = OnnxBackend(target="cuda")
            out = be.lower(prepare(graphs, be, compute="bf16"), Path(tmp) / "cuda")
            rows.append(("onnx cuda bf16", widened_bytes(out, args.entry), None))
    mib = 2**20
    print(f"{args.model}, {args.entry}: release bytes {release / mib:.1f} MiB; held: RSS growth at the "
          "session's creation (CPU provider)")
    print(f"{'artifact':<15} {'Cast-widened MiB':>16} {'held MiB':>9} {'x release':>9}")
    for name, widened, held in rows:
        print(f"{name:<15} {widened / mib:>16.1f} " + (f"{held / mib:>9.1f} {held / release:>9.2f}" if held is not None
                                                        else f"{'-':>9} {'-':>9}"))


if __name__ == "__main__":
    main()
