"""KDA's decode step as one op: short convs, l2norm, forget gate, beta, one recurrent step,
gated RMSNorm (see README.md). naive.py is the definition; tvm/ and triton/ the kernels."""

from .naive import GATES, kda_decode_gate, naive_kda_decode_step

__all__ = ["GATES", "kda_decode_gate", "naive_kda_decode_step"]
