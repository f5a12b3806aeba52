"""k3c.frontend: torch.export -> k3c IR through a table of small builders."""

if __name__ != "k3c.frontend":  # imported under its bare name, e.g. from the repository root: kernels/bare_name.py
    import os as _os
    import runpy as _runpy  # by path: under a bare name there is no package to import the guard from

    _runpy.run_path(_os.path.join(_os.path.dirname(_os.path.dirname(__file__)), "kernels", "bare_name.py"))[
        "guard"](globals())  # a probe gets a stand-in that holds nothing; an import statement, the error


from .capture import capture
from .table import TABLE
from .translate import CaptureError, UnsupportedOpError

__all__ = ["capture", "TABLE", "CaptureError", "UnsupportedOpError"]
