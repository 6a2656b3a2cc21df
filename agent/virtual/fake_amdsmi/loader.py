"""Load a private copy of the real amdsmi package on top of a fake libamd_smi.so.

amdsmi binds every C symbol at import time: amdsmi_wrapper.py calls ``ctypes.CDLL`` on the
first libamd_smi.so it finds and fetches each function from it. The copy (package
``amdsmi_fake_<n>``, executed from the package's own files, unchanged) runs its wrapper with a
``ctypes`` whose ``CDLL`` returns the fake instead, so every symbol the wrapper binds comes from
the fake; everything else in that ``ctypes`` is the real module. Each copy has its own wrapper,
interface and exception classes, so one process can hold many fakes at once.

The package is the importable ``amdsmi`` (the installed one, or the first on ``PYTHONPATH``) or
any other release's, given by directory (an unpacked wheel, ROCm's ``/opt/rocm/share/amd_smi``).
Before the wrapper runs, the fake library is told which release it is serving
(:mod:`agent.virtual.fake_amdsmi.release`), so it offers that release's C symbols and no others.
"""

from __future__ import annotations

import builtins
import ctypes
import importlib.util
import itertools
import sys
import threading
import types
from pathlib import Path
from typing import Any

from agent.virtual.fake_amdsmi.release import release_of

_counter = itertools.count(1)
_lock = threading.Lock()


def amdsmi_dir() -> Path:
    """Where the installed amdsmi package (PyPI ``amdsmi``) lives."""
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or spec.origin is None:
        raise ImportError("the amdsmi package is not installed")
    return Path(spec.origin).parent


class _Ctypes(types.ModuleType):
    """The real ctypes, except that CDLL opens ``library`` (or nothing)."""

    def __init__(self, library: Any | None) -> None:
        super().__init__("ctypes")
        self._library = library

    def __getattr__(self, name: str) -> Any:
        return getattr(ctypes, name)

    def CDLL(self, name: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (ctypes' name)
        library = self._library
        if library is None or not getattr(library, "present", True):
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return library


def _builtins_with_ctypes(fake: types.ModuleType) -> dict[str, Any]:
    """A ``__builtins__`` whose ``import ctypes`` yields ``fake``."""
    real_import = builtins.__import__

    def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if name == "ctypes" and level == 0:
            return fake
        return real_import(name, globals, locals, fromlist, level)

    namespace = dict(vars(builtins))
    namespace["__import__"] = _import
    return namespace


def _module(name: str, path: Path, *, package: Path | None = None) -> tuple[types.ModuleType, Any]:
    locations = [str(package)] if package is not None else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    assert spec is not None and spec.loader is not None
    return importlib.util.module_from_spec(spec), spec.loader


def load_amdsmi(library: Any | None, package_dir: Path | str | None = None) -> types.ModuleType:
    """A fresh, independent copy of an amdsmi package whose libamd_smi.so is ``library``.

    ``package_dir`` is the ``amdsmi`` package directory (holding ``amdsmi_wrapper.py``) of the
    release to load; by default the importable one. ``None`` as library (or a library whose
    profile says it is not installed) behaves like a machine without ROCm: the wrapper prints why
    it found no libamd_smi.so and the import fails with KeyError('libamd_smi.so'). A library
    lacking a symbol the wrapper binds fails the import with ctypes' AttributeError "undefined
    symbol: <name>".
    """
    with _lock:
        name = f"amdsmi_fake_{next(_counter)}"
    root = Path(package_dir) if package_dir is not None else amdsmi_dir()
    if not (root / "amdsmi_wrapper.py").exists():
        raise ImportError(f"{root} is not an amdsmi package (no amdsmi_wrapper.py)")
    play = getattr(library, "play", None)
    if play is not None:
        play(release_of(root))
    package, package_loader = _module(name, root / "__init__.py", package=root)
    wrapper, wrapper_loader = _module(f"{name}.amdsmi_wrapper", root / "amdsmi_wrapper.py")
    wrapper.__builtins__ = _builtins_with_ctypes(_Ctypes(library))  # type: ignore[attr-defined]
    sys.modules[name] = package
    sys.modules[wrapper.__name__] = wrapper
    try:
        wrapper_loader.exec_module(wrapper)
        package.amdsmi_wrapper = wrapper  # type: ignore[attr-defined]
        package_loader.exec_module(package)
    except BaseException:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            sys.modules.pop(key, None)
        raise
    return package
