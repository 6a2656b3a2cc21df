"""Load a private copy of the real pynvml module on top of a fake libnvidia-ml.

pynvml keeps its library, function-pointer cache, init refcount and even its exception classes
in module globals. A fresh copy per fake (``pynvml_fake_<n>``, executed from the installed
pynvml.py, or from any release's pynvml.py given by path) keeps fakes independent, so one test
process can hold many nodes, drivers, failure modes and nvidia-ml-py releases at once; setting
``nvmlLib`` makes pynvml skip loading ``libnvidia-ml.so.1``.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import threading
import types
from pathlib import Path
from typing import Any

_counter = itertools.count(1)
_lock = threading.Lock()


def pynvml_path() -> str:
    """Where the installed pynvml.py (package nvidia-ml-py) lives."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise ImportError("pynvml (package nvidia-ml-py) is not installed")
    return spec.origin


def load_pynvml(library: Any | None, path: str | Path | None = None) -> types.ModuleType:
    """A fresh, independent copy of the real pynvml whose C library is ``library``.

    ``None`` leaves the library unset, so nvmlInit tries the real libnvidia-ml.so.1 (and raises
    NVMLError_LibraryNotFound on a machine without the driver). ``path``: the pynvml.py to run
    (e.g. an older nvidia-ml-py release unpacked by tests/wheels.py); default the importable one.
    """
    source = Path(path) if path is not None else Path(pynvml_path())
    if not source.is_file():
        raise ImportError(f"no pynvml.py at {source}")
    with _lock:
        name = f"pynvml_fake_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pynvml's _extractNVMLErrorsAsClasses looks itself up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    module.nvmlLib = library
    return module
