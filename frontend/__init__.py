"""k3c.frontend: torch.export -> k3c IR through a table of small builders."""

if __name__ != "k3c.frontend":  # this folder imported under its bare name, e.g. by a script in the repository root
    raise ImportError(f"'{__name__}' is a folder of k3c's source tree, not a package: import k3c.frontend. A script "
                      f"run from k3c's repository root finds this folder when it, or a library it uses (transformers "
                      f"looks for a package named 'kernels'), imports 'frontend': run it from another directory")


from .capture import capture
from .table import TABLE
from .translate import CaptureError, UnsupportedOpError

__all__ = ["capture", "TABLE", "CaptureError", "UnsupportedOpError"]
