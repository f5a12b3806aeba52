"""The delta-rule family's Triton kernels: the chunked prefill as three pieces and the fused recurrent step.

    chunk_prepare     (a) intra-chunk: cumulative gates, scores, WY/UT transform  intra.py
    chunk_state_scan  (b) the state scan over chunks                              scan.py
    chunk_output      (c) the output                                              output.py
    chunk_kda / chunk_delta   (a), (b), (c) in a row                              chunk.py
    fused_recurrent   token by token: the decode step                             recurrent.py
    recurrent         any member token by token, by its gate kind                 recurrent.py

The gated delta rule, the delta rule and (without the delta correction) linear attention
reuse these kernels. References: k3c.kernels.delta.chunk and k3c.kernels.kda.naive.
"""

from .chunk import chunk_delta, chunk_kda
from .intra import chunk_prepare
from .output import chunk_output
from .recurrent import fused_recurrent, recurrent
from .scan import chunk_state_scan

__all__ = ["chunk_prepare", "chunk_state_scan", "chunk_output", "chunk_kda", "chunk_delta", "fused_recurrent",
           "recurrent"]
