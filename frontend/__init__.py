"""k3c.frontend: torch.export -> k3c IR through a table of small builders."""

from .capture import capture
from .table import TABLE
from .translate import CaptureError, UnsupportedOpError

__all__ = ["capture", "TABLE", "CaptureError", "UnsupportedOpError"]
