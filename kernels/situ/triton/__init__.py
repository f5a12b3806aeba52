"""SiTU's Triton kernels (epilogue.py): the elementwise activation and the gate/up GEMM with
the activation in its epilogue. Reference: ../naive.py."""

from .epilogue import gated_act, gated_mlp, situ, tanh

__all__ = ["situ", "gated_mlp", "gated_act", "tanh"]
