"""k3c where users already are: a transformers exporter backend and a torch.compile backend.

    import k3c.integrations.transformers      # registers export format "k3c" with transformers.exporters
    torch.compile(model, backend="k3c")       # found through the torch_dynamo_backends entry point

Each integration imports its library only when it is itself imported, so `import k3c` never
needs transformers; a missing library is a `MissingPackageError` naming the package.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import UsageError


class MissingPackageError(UsageError, ImportError):
    """An integration asked for whose library is not installed (an ImportError too, so
    `pytest.importorskip`-style code and `except ImportError` see it as one)."""


def require(package: str, what: str, pin: str | None = None) -> ModuleType:
    """`import package`, or a one-line MissingPackageError saying what needs it and how to get it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        hint = f"pip install {pin or package}"
        raise MissingPackageError(f"{what} needs the package {package!r}, which is not installed ({hint})") from None


__all__ = ["MissingPackageError", "require"]
