"""The one error class of checkpoint reading and writing (defined with k3c's other errors)."""

from __future__ import annotations

from ...errors import CheckpointError

__all__ = ["CheckpointError"]
