"""The one error class of checkpoint reading and writing."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as the model its config describes: names the file or keys."""
