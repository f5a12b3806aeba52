"""TensorIR kernels of the delta-rule family for the TVM backend (KDA, the gated delta rule,
DeltaNet): the recurrent step (recurrent.py) and the chunked WY/UT pieces (chunk.py)."""
