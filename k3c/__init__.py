"""k3c: a compiler for hybrid linear-attention models of the Kimi K3 family.

    model = k3c.models.build("k3-tiny")
    graph = k3c.capture(model, (input_ids,))          # torch.export -> k3c IR
    graph = k3c.passes.run(graph, "default")           # fuse, chunk, fold
    run = k3c.compile(model, "onnx", (input_ids,))     # IR -> artifact -> callable
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import backends, ir, kernels, models, passes  # noqa: F401  (kernels registers torch.ops.k3c.*)
from .compiler import CompiledModel, capture_entries, compile
from .frontend import capture

__all__ = ["__version__", "capture", "compile", "capture_entries", "CompiledModel", "kernels", "models", "ir",
           "passes", "backends"]
