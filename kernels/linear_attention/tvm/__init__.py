"""TensorIR kernel of normalised linear attention for the TVM backend (recurrent.py)."""
