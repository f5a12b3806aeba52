"""The Triton backend: optimized IR -> one generated Python+Triton module -> a runner.

    backend = k3c.backends.get("triton")
    backend.lower(graphs, out_dir)        # writes out_dir/model_triton.py + weights + manifest
    runner = backend.load(out_dir)        # runner.run("prefill", input_ids) -> outputs

See README.md for how nodes become kernels and how the mode (GPU or TRITON_INTERPRET=1) is
chosen.
"""

from .backend import MODULE_FILE, TritonBackend, TritonRunner
from .codegen import generate_module

__all__ = ["TritonBackend", "TritonRunner", "generate_module", "MODULE_FILE"]
