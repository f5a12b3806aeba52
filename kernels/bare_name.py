"""A top-level folder of k3c (kernels, models, ir, passes, frontend, backends) imported under
its bare name, as a script run from the repository root finds it.

transformers looks for Hugging Face's `kernels` package with `importlib.util.find_spec`, then,
finding no distribution of that name, imports it with `importlib.import_module` and counts a
module without `__file__` or `__version__` as no package; any library may probe any of the
other names so. From k3c's repository root that import finds the folder. A probe must not
fail and must not run k3c's code under a second name (its torch ops would register twice), so
it gets a stand-in: no file, no version, no submodule that runs code; any use of it, or of a
name in it, raises the ImportError that says to import k3c.<name>. An `import models` written
in a script is refused at once.

Each folder's __init__ calls `guard(globals())` first when its `__name__` is not k3c's (the
others load this file by path: under a bare name there is no package to import it from). For
a probe, the rest of that __init__ still runs, against stand-ins: its relative imports (`.x`
and `..x`) resolve under a private root of stand-ins, and while it runs a name taken from
them absorbs calls, attributes and iteration, so module-level code such as
`Registry("pipeline")` or `tuple(PRESETS)` completes without running anything of k3c's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

ROOT = "_k3c_bare_name"  # the private root the relative imports of a probed __init__ resolve under


def message(name: str) -> str:
    return (f"'{name}' is a folder of k3c's source tree, not a package: import k3c.{name}. A script run from "
            f"k3c's repository root finds this folder when it, or a library it uses (transformers looks for a "
            f"package named 'kernels'), imports '{name}': run it from another directory")


def _folder(module_name: str) -> str:
    """The folder a stand-in's name refers to: `_k3c_bare_name.kernels.kda` -> kernels."""
    name = module_name[len(ROOT) + 1:] if module_name.startswith(ROOT + ".") else module_name
    return name.partition(".")[0] or "kernels"


def probed(init: str) -> bool:
    """True when the import of the folder whose __init__ is `init` came through
    `importlib.import_module` (a library's probe), not from an `import` statement."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_filename == init and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    frame = frame.f_back if frame is not None else None
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_name == "import_module" \
        and frame.f_globals.get("__name__") == "importlib"


def _probe_running() -> bool:
    """True while the __init__ of a probed folder runs (its package is under ROOT)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and str(frame.f_globals.get("__package__", "")).startswith(ROOT + "."):
            return True
        frame = frame.f_back
    return False


class _Refused:
    """A name taken from a stand-in. While a probed __init__ runs it absorbs what that code
    does with it; afterwards any use raises the ImportError."""

    def __init__(self, folder: str):
        self._folder = folder

    def _refuse(self):
        if _probe_running():
            return self
        raise ImportError(message(object.__getattribute__(self, "_folder")))

    def __call__(self, *args, **kwargs):
        return self._refuse()

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._refuse()

    def __getitem__(self, key):
        return self._refuse()

    def __iter__(self):
        self._refuse()
        return iter(())


class StandIn(types.ModuleType):
    """The module a probe gets: no `__file__`, no `__version__`, every other name refused."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__file__ = None
        self.__path__ = []

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if "." in self.__name__ or _probe_running():
            return _Refused(_folder(self.__name__))
        raise ImportError(message(_folder(self.__name__)))

    def __call__(self, *args, **kwargs):  # a submodule bound under a function's name (`kda`)
        raise ImportError(message(_folder(self.__name__)))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Submodules of a stand-in, and everything under ROOT, are stand-ins too."""

    def __init__(self):
        self.roots = {ROOT}

    def find_spec(self, name, path=None, target=None):
        if name == ROOT or "." in name and name.partition(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return StandIn(spec.name)

    def exec_module(self, module) -> None:
        pass


def _finder() -> _Finder:
    """The one finder of the process (this file may be loaded once per folder)."""
    for f in sys.meta_path:
        if getattr(f, "_k3c_bare_name", False):
            return f
    f = _Finder()
    f._k3c_bare_name = True
    sys.meta_path.insert(0, f)
    return f


def guard(init_globals: dict) -> None:
    """First thing in a folder's __init__ run under its bare name: an import statement raises
    the ImportError; a probe makes `sys.modules[name]` a stand-in and points the rest of the
    __init__'s relative imports at stand-ins."""
    name, init = init_globals["__name__"], init_globals["__file__"]
    if not probed(init):
        raise ImportError(message(name))
    module = StandIn(name)
    sys.modules[name] = sys.modules[f"{ROOT}.{name}"] = module  # one object: submodules bind on the stand-in
    _finder().roots.add(name)
    init_globals["__package__"] = f"{ROOT}.{name}"
    init_globals["__spec__"] = importlib.machinery.ModuleSpec(f"{ROOT}.{name}", None, is_package=True)
