"""KDA's decode step as one Triton kernel (step.py); reference: ../naive.py."""

from .step import kda_decode_step

__all__ = ["kda_decode_step"]
