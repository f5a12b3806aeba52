"""The fixed-capacity cache's row write in Triton (write.py), in place. Reference: ../naive.py."""

from .write import cache_write, check_positions

__all__ = ["cache_write", "check_positions"]
