"""A fake DCGM: the Python binding modules' shapes plus a libdcgm and nv-hostengine driven by the virtual fleet.

NVIDIA's DCGM Python bindings (``pydcgm``, ``dcgm_agent``, ``dcgm_structs``, ``dcgm_fields``,
``dcgmvalue``) ship only with the datacenter-gpu-manager packages, not on PyPI, so they cannot be
installed here. The fake therefore stands in at the level roofwatch imports: ``bindings/`` holds
modules with the same names, functions, argument order, constants, error classes, structs and
blank sentinels as the real ones (each module's docstring names the real source), and they
call a Python libdcgm (:class:`FakeDcgmLibrary`) over a fake host engine (:class:`FakeHostEngine`)
that reads the same virtual node the fake NVML plays::

    engine = FakeHostEngine(virtual_backend)          # the node's GPUs, as DCGM sees them
    modules = load_bindings([BINDINGS_DIR])             # agent.backends.dcgm.bindings
    install(modules.structs, FakeDcgmLibrary(engine))   # what loading libdcgm.so would have done

``roofwatch demo --backend nvml-virtual --dcgm on`` does exactly this (agent/backends/registry.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.virtual.fake_dcgm.engine import FakeHostEngine
from agent.virtual.fake_dcgm.library import FakeDcgmLibrary

BINDINGS_DIR = Path(__file__).resolve().parent / "bindings"


def install(structs: Any, library: FakeDcgmLibrary) -> None:
    """Make ``structs`` (a dcgm_structs module) use ``library`` as its loaded libdcgm.

    Bindings of another major release than the library's keep looking for their own soname and
    fail with DCGMError_LibraryNotFound, as bindings 4 do on a DCGM 3 install.
    """
    with structs.libLoadLock:
        structs._dcgmGetFunctionPointer_cache.clear()
        matches = getattr(structs, "DCGM_MAJOR_VERSION", library.engine.major) == library.engine.major
        structs.dcgmLib = library if matches else None


__all__ = ["BINDINGS_DIR", "FakeDcgmLibrary", "FakeHostEngine", "install"]
