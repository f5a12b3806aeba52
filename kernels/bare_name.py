"""This folder imported under its bare name `kernels` by a library probing for a package.

transformers looks for Hugging Face's `kernels` package with `importlib.util.find_spec`, then,
finding no distribution of that name, imports it with `importlib.import_module` and counts a
module without `__file__` or `__version__` as no package. From k3c's repository root that
import finds this folder. A probe must not fail and must not run k3c's kernels under a second
name (their torch ops would register twice), so it gets a stand-in: no file, no version, no
submodule that runs code; any use of it, or of a name in it, raises the ImportError that says
to import k3c.kernels. An `import kernels` written in a script is refused at once
(kernels/__init__.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


def message(name: str) -> str:
    return (f"'{name}' is a folder of k3c's source tree, not a package: import k3c.{name}. A script run from "
            f"k3c's repository root finds this folder when it, or a library it uses (transformers looks for a "
            f"package named 'kernels'), imports '{name}': run it from another directory")


def probed() -> bool:
    """True when the import in progress came through `importlib.import_module` (a library's
    probe), not from an `import` statement."""
    frame = sys._getframe(2)  # the frame that imports the folder's __init__ (frame 1)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_name == "import_module" \
        and frame.f_globals.get("__name__") == "importlib"


class _Refused:
    """A name of the stand-in: using it raises the ImportError."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise ImportError(message(self._name))

    def __getattr__(self, attr: str):
        raise ImportError(message(object.__getattribute__(self, "_name")))


class StandIn(types.ModuleType):
    """The module a probe gets: no `__file__`, no `__version__`, every other name refused."""

    def __init__(self, name: str, init: str = ""):
        super().__init__(name)
        self.__file__ = None
        self.__path__ = []
        self._init = init  # the folder's __init__.py: while it runs, its imports bind _Refused names

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr == "_init":
            raise AttributeError(attr)
        root, _, sub = self.__name__.partition(".")
        if sub or _running(self._init):
            return _Refused(root)
        raise ImportError(message(root))

    def __call__(self, *args, **kwargs):  # a submodule bound under a function's name (`kda`)
        raise ImportError(message(self.__name__.partition(".")[0]))


def _running(init: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == init and frame.f_code.co_name == "<module>":
            return True
        frame = frame.f_back
    return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Submodules of the stand-in (`from .kda import kda` in the folder's __init__) are stand-ins too."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return StandIn(spec.name)

    def exec_module(self, module) -> None:
        pass


def stand_in(name: str, init: str) -> None:
    """Make `sys.modules[name]` the stand-in; the rest of `init`, the folder's __init__.py,
    then binds only refused names."""
    sys.modules[name] = StandIn(name, init)
    if not any(isinstance(f, _Finder) and f.root == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name))
