"""Serve two prompts that share a prefix, computing the prefix once: prefill it, keep a
snapshot of the state, and continue the snapshot with each prompt's own tokens (`extend`).

    python examples/prefix_reuse.py [--backend onnx] [--model k3-tiny]

Each continuation is checked against a prefill of its whole prompt computed from scratch (the
logits of its last token and its next greedy token). A snapshot is a copy of the whole state:
a fixed-capacity artifact writes its caches in place, so a state continued without a copy is
the old one no more. The recurrent state of a KDA layer is what the prefix leaves behind;
a wrong one (a state from another prompt, or zeros) gives other logits, which is what the
check would catch.
"""

from __future__ import annotations

import argparse
import sys

import torch

import k3c
from k3c.numerics import TOLERANCES, rel_rms_err


def snapshot(state: dict) -> dict:
    """A copy of every tensor of `state`: continuing it leaves the snapshot as it was."""
    return {name: t.clone() for name, t in state.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="onnx")
    p.add_argument("--model", default="k3-tiny")
    args = p.parse_args()
    model = k3c.models.build(args.model).eval()
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, model.config.vocab_size, (1, 40), generator=gen)
    suffixes = [torch.randint(0, model.config.vocab_size, (1, n), generator=gen) for n in (7, 12)]
    run = k3c.compile(model, args.backend, (prefix[:, :16],), max_context=64)
    _, at_prefix = run.prefill(prefix)  # computed once
    kept = snapshot(at_prefix)
    worst = 0.0
    for i, suffix in enumerate(suffixes):
        logits, _ = run.extend(suffix, snapshot(kept), logits="last")
        whole, _ = run.prefill(torch.cat([prefix, suffix], dim=1), logits="last")
        err = rel_rms_err(logits, whole)
        worst = max(worst, err)
        print(f"prompt {i}: prefix of {prefix.shape[1]} reused + {suffix.shape[1]} new tokens; next token "
              f"{int(logits.argmax())} (from scratch {int(whole.argmax())}), logits rel RMS {err:.1e}")
    ok = worst <= TOLERANCES[torch.float32].rel_rms  # both sides are the artifact's fp32 arithmetic
    print("prefix reuse matches a prefill from scratch" if ok else "prefix reuse DIFFERS from a prefill")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
