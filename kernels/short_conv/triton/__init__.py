"""The short convolution's Triton kernel (depthwise.py); reference: ../naive.py."""

from .depthwise import short_conv

__all__ = ["short_conv"]
