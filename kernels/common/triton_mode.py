"""Which way Triton kernels run in this process, decided without importing triton.

Triton reads TRITON_INTERPRET when it is first imported (its own language functions are
built then) and when each kernel is decorated, and torch.export imports triton while it
captures a model. So k3c decides at `import k3c` (backends/__init__.py calls `choose()`):
without a CUDA device and without a TRITON_INTERPRET of the user's, it sets
TRITON_INTERPRET=1, and every Triton kernel of k3c runs under the interpreter on the CPU.
"""

from __future__ import annotations

import os
import sys


def choose() -> bool:
    """Set TRITON_INTERPRET=1 when there is no CUDA device and nobody chose; True when Triton
    kernels will run under the interpreter. Raises ImportError when triton was imported
    before the choice could be made on a machine that needs the interpreter."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if torch.cuda.is_available():
            return False
        if "triton" in sys.modules:  # its language functions are already compiled-mode objects
            raise ImportError("triton was imported before k3c could set TRITON_INTERPRET=1 on this machine without "
                              "CUDA; set TRITON_INTERPRET=1 in the environment, or import k3c before triton")
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreted()


def interpreted() -> bool:
    """True when Triton kernels run under the interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
